"""The tokenizer every piece uses: `tokenizer.json` + `tokenizer_config.json` from a model dir.

Read with `tokenizers` directly and a sandboxed Jinja environment set up like Hugging Face's
`apply_chat_template` (trim_blocks, lstrip_blocks, `tojson`, `raise_exception`, `strftime_now`),
so no `transformers`, no torch and no remote code. The character tokenizer of the tiny task
(`char_tokenizer.py`) is saved in the same two files and loads through the same path.

    tok = load_tokenizer("results/models/qwen2.5-0.5b-instruct")
    ids = tok.prompt_ids(gsm8k_prompt(question), system=GSM8K_SYSTEM)
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from ratchet.errors import InputError, MissingInputError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"  # where newer transformers save the template
GENERATION_CONFIG_FILE = "generation_config.json"


class Tokenizer:
    """Text <-> ids, the stop ids, and the prompt as the model was trained to see it."""

    def __init__(self, tokenizer: HFTokenizer, config: dict, source: str,
                 chat_template: str | None = None, extra_eos_ids: list[int] | None = None):
        self.hf = tokenizer
        self.config = config
        self.source = source
        self.chat_template = chat_template
        self.special_tokens = {name: _token_text(config.get(name))
                               for name in ("bos_token", "eos_token", "pad_token", "unk_token")
                               if _token_text(config.get(name)) is not None}
        eos_ids = []
        if "eos_token" in self.special_tokens:
            eos_ids.append(self._special_id("eos_token"))
        for token_id in extra_eos_ids or []:
            if token_id not in eos_ids:
                eos_ids.append(int(token_id))
        if not eos_ids:
            raise InputError(f"tokenizer {source}: {CONFIG_FILE} names no eos_token")
        self.eos_ids: list[int] = eos_ids
        # Without a pad token, padding with the first eos is what the engine and trainer expect:
        # padded positions are masked out, so the id only has to exist.
        self.pad_id: int = (self._special_id("pad_token") if "pad_token" in self.special_tokens
                            else eos_ids[0])

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (added tokens included). A model's embedding may be
        larger (Qwen2.5 pads to 151,936); it is never smaller."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, no BOS/EOS added; special tokens written in the text are recognised."""
        try:
            return self.hf.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # tokenizers raises a bare Exception (e.g. a character with no id)
            raise InputError(f"tokenizer {self.source}: cannot encode {text[:80]!r}: "
                             f"{exc}") from None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text, on every core (tokenizers' Rust threads): 7,473 GSM8K prompts
        in a fraction of the 2.4 s one at a time takes; an error names the text, as `encode`."""
        try:
            return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]
        except Exception:  # noqa: BLE001 (tokenizers raises a bare Exception): find the culprit one at a time
            return [self.encode(text) for text in texts]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render_prompt(self, question: str, system: str | None = None) -> str:
        """The prompt text: the chat template with the generation prompt, or the raw question."""
        if self.chat_template is None:
            if system is not None:
                raise InputError(f"tokenizer {self.source}: a system message was given but the "
                                 "tokenizer has no chat template to place it in")
            return question
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        messages.append({"role": "user", "content": question})
        template = _compile_template(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=True, **self.special_tokens)

    def prompt_ids(self, question: str, system: str | None = None) -> list[int]:
        return self.encode(self.render_prompt(question, system))

    def _special_id(self, name: str) -> int:
        text = self.special_tokens[name]
        token_id = self.hf.token_to_id(text)
        if token_id is None:
            raise InputError(f"tokenizer {self.source}: {name} {text!r} from {CONFIG_FILE} is not "
                             f"in {TOKENIZER_FILE}")
        return token_id


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """Read `tokenizer.json` and `tokenizer_config.json` (and, when present, the chat template
    from `chat_template.jinja` and extra stop ids from `generation_config.json`)."""
    model_dir = Path(model_dir)
    tokenizer_path = model_dir / TOKENIZER_FILE
    config_path = model_dir / CONFIG_FILE
    if not tokenizer_path.is_file():
        raise MissingInputError(f"tokenizer: {tokenizer_path} not found")
    try:
        hf = HFTokenizer.from_file(str(tokenizer_path))
    except Exception as exc:
        raise InputError(f"tokenizer: {tokenizer_path} is not a valid tokenizers file: "
                         f"{exc}") from None
    config = _read_json(config_path) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise InputError(f"tokenizer: {config_path} must hold a JSON object")
    chat_template = _pick_template(config.get("chat_template"), config_path)
    if chat_template is None and (model_dir / TEMPLATE_FILE).is_file():
        chat_template = (model_dir / TEMPLATE_FILE).read_text()
    extra_eos = []
    generation_path = model_dir / GENERATION_CONFIG_FILE
    if generation_path.is_file():
        eos = _read_json(generation_path).get("eos_token_id")
        extra_eos = [eos] if isinstance(eos, int) else list(eos or [])
    return Tokenizer(hf, config, str(model_dir), chat_template, extra_eos)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"tokenizer: cannot read {path}: {exc}") from None


def _token_text(token) -> str | None:
    """tokenizer_config writes a special token as a string or as an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content")
    return token


def _pick_template(template, source: Path) -> str | None:
    """A template is a string, or a list of {"name", "template"} of which "default" is used."""
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        for entry in template:
            if isinstance(entry, dict) and entry.get("name") == "default":
                return entry["template"]
    raise InputError(f"tokenizer: {source}: chat_template is neither a string nor a list holding "
                     "a 'default' template")


@lru_cache(maxsize=8)
def _compile_template(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters; templates expect plain JSON
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
