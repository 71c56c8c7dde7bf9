"""The tiny task's tokenizer: one id per character, saved as a real `tokenizers` file.

Ids: `<pad>` = 0, `<eos>` = 1, then the alphabet in order. Each character is its own
pre-token (`Split` on any single character), looked up in a `WordLevel` vocabulary, and the
`Fuse` decoder joins the pieces without spaces, so `decode(encode(s)) == s` for every string
over the alphabet. A character outside the alphabet has no id and `encode` refuses it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ratchet.data.tokenizer import CONFIG_FILE, TOKENIZER_FILE
from ratchet.errors import InputError

PAD, EOS = "<pad>", "<eos>"
SPECIALS = (PAD, EOS)


def char_vocab(alphabet: str) -> dict[str, int]:
    if not alphabet:
        raise InputError("char tokenizer: the alphabet is empty")
    if len(set(alphabet)) != len(alphabet):
        raise InputError(f"char tokenizer: alphabet {alphabet!r} repeats a character")
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    vocab.update({char: len(SPECIALS) + i for i, char in enumerate(alphabet)})
    return vocab


def build_char_tokenizer(alphabet: str) -> HFTokenizer:
    tokenizer = HFTokenizer(models.WordLevel(char_vocab(alphabet), unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token in SPECIALS])
    return tokenizer


def save_char_tokenizer(out_dir: str | Path, alphabet: str) -> Path:
    """Write `tokenizer.json` and `tokenizer_config.json` (no chat template) into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_char_tokenizer(alphabet).save(str(out_dir / TOKENIZER_FILE))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(i): {"content": token, "special": True, "lstrip": False,
                                          "rstrip": False, "normalized": False,
                                          "single_word": False}
                                 for i, token in enumerate(SPECIALS)},
    }
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
