"""Tokenizers: the character tokenizer's round trip, and a small BPE one with a ChatML template
read the way a real Qwen model dir is (checked against transformers' own rendering)."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from ratchet.data.char_tokenizer import save_char_tokenizer
from ratchet.data.synthetic import ALPHABET, make_arithmetic
from ratchet.data.tokenizer import load_tokenizer

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


# ---------------------------------------------------------------- the character tokenizer

@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    return save_char_tokenizer(tmp_path_factory.mktemp("char"), ALPHABET)


def test_char_tokenizer_ids_and_round_trip(char_dir):
    tok = load_tokenizer(char_dir)
    assert tok.vocab_size == 2 + len(ALPHABET)
    assert tok.eos_ids == [1] and tok.pad_id == 0
    assert tok.encode("037+2=") == [2 + ALPHABET.index(c) for c in "037+2="]
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12)))
        ids = tok.encode(text)
        assert len(ids) == len(text)
        assert tok.decode(ids) == text
    train, _ = make_arithmetic(50, 10)
    for question in train["question"]:
        assert tok.decode(tok.encode(question)) == question


def test_char_tokenizer_specials(char_dir):
    tok = load_tokenizer(char_dir)
    ids = tok.encode("7") + tok.eos_ids + [tok.pad_id]
    assert tok.decode(ids) == "7"
    assert tok.decode(ids, skip_special_tokens=False) == "7<eos><pad>"
    assert tok.encode("7<eos>") == [2 + ALPHABET.index("7"), 1]


def test_char_tokenizer_prompt_is_the_raw_question(char_dir):
    tok = load_tokenizer(char_dir)
    assert tok.chat_template is None
    assert tok.prompt_ids("12+1=") == tok.encode("12+1=")
    with pytest.raises(ValueError, match="no chat template"):
        tok.prompt_ids("12+1=", system="be brief")


def test_char_tokenizer_refuses_unknown_characters(char_dir):
    with pytest.raises(ValueError, match="cannot encode '1a2'"):
        load_tokenizer(char_dir).encode("1a2")


def test_char_tokenizer_keeps_spaces_and_newlines(tmp_path):
    tok = load_tokenizer(save_char_tokenizer(tmp_path, "ab \n"))
    assert tok.decode(tok.encode(" a\nb  ")) == " a\nb  "
    with pytest.raises(ValueError, match="repeats"):
        save_char_tokenizer(tmp_path / "x", "aba")


def test_char_tokenizer_loads_in_transformers(char_dir):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(char_dir / "tokenizer.json"),
                                 eos_token="<eos>", pad_token="<pad>")
    ours = load_tokenizer(char_dir)
    assert hf.encode("037+2=", add_special_tokens=False) == ours.encode("037+2=")
    assert hf.eos_token_id == 1 and hf.pad_token_id == 0


# ---------------------------------------------------------------- a BPE tokenizer with ChatML

def build_bpe_dir(path, config_extra=None, template_in_config=True):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Natalia sold clips to 48 of her friends in April.",
              "You are a helpful assistant. Reason step by step.",
              "system user assistant how many apples are left?"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              **(config_extra or {})}
    if template_in_config:
        config["chat_template"] = CHATML
    else:
        (path / "chat_template.jinja").write_text(CHATML)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return build_bpe_dir(tmp_path_factory.mktemp("bpe"))


def test_chatml_prompt(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    question = "How many apples are left?"
    expected = ("<|im_start|>system\nReason step by step.<|im_end|>\n"
                f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
    assert tok.render_prompt(question, system="Reason step by step.") == expected
    ids = tok.prompt_ids(question, system="Reason step by step.")
    im_start = tok.hf.token_to_id("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 3  # each special is one id
    assert tok.decode(ids, skip_special_tokens=False) == expected
    # the template's own default system message when none is given
    assert tok.render_prompt(question).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert tok.eos_ids == [tok.hf.token_to_id("<|im_end|>")]
    assert tok.pad_id == tok.hf.token_to_id("<|endoftext|>")
    assert tok.vocab_size == tok.hf.get_vocab_size(with_added_tokens=True)
    text = "Natalia sold 48 clips."
    assert tok.decode(tok.encode(text)) == text


def test_chatml_prompt_matches_transformers(bpe_dir):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(bpe_dir / "tokenizer.json"))
    hf.chat_template = CHATML
    messages = [{"role": "system", "content": "Reason step by step."},
                {"role": "user", "content": "How many apples?"}]
    out = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = out["input_ids"] if hasattr(out, "keys") else out
    assert load_tokenizer(bpe_dir).prompt_ids("How many apples?", "Reason step by step.") == \
        list(expected)


def test_template_file_generation_config_and_dict_tokens(tmp_path):
    path = build_bpe_dir(tmp_path / "m", template_in_config=False,
                         config_extra={"eos_token": {"content": "<|im_end|>", "special": True},
                                       "pad_token": None})
    hf = Tokenizer.from_file(str(path / "tokenizer.json"))
    im_end, endoftext = hf.token_to_id("<|im_end|>"), hf.token_to_id("<|endoftext|>")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [im_end, endoftext]}))
    tok = load_tokenizer(path)
    assert tok.chat_template is not None
    assert tok.eos_ids == [im_end, endoftext]  # tokenizer_config's first, no repeats
    assert tok.pad_id == im_end  # no pad token: the first eos


def test_missing_or_broken_tokenizer_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer.json")):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json is not a valid tokenizers file"):
        load_tokenizer(tmp_path)


def test_bad_config_is_named(tmp_path):
    path = build_bpe_dir(tmp_path / "m", config_extra={"eos_token": "<|nope|>"})
    with pytest.raises(ValueError, match=r"eos_token '<\|nope\|>' from tokenizer_config.json"):
        load_tokenizer(path)
    (path / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="cannot read .*tokenizer_config.json"):
        load_tokenizer(path)


def test_prompts_encoded_as_one_batch_are_each_prompts_ids(bpe_dir, char_dir):
    """Task.load encodes the training prompts as one batch (on every core): the ids of each
    are `make_prompt_fn`'s, and a text the tokenizer refuses is still named."""
    from ratchet.data.prompts import make_prompt_fn, prompts_for

    questions = ["How many apples are left?", "Natalia sold 48 clips.\nHow many?", " spaces  "]
    tok = load_tokenizer(bpe_dir)
    assert prompts_for(tok, "local", questions) == [make_prompt_fn(tok, "local")(q) for q in questions]
    chars = load_tokenizer(char_dir)
    assert prompts_for(chars, "synthetic", ["12+1=", "3+4="]) == [chars.encode("12+1="), chars.encode("3+4=")]
    with pytest.raises(ValueError, match="cannot encode '1a2'"):
        prompts_for(chars, "synthetic", ["12+1=", "1a2"])
    with pytest.raises(ValueError, match="unknown data source 'nowhere'"):
        prompts_for(chars, "nowhere", ["12+1="])
