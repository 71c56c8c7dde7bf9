"""download_model: fetch or make the source model, and record where it is.

Writes `results/<run>/source/source.json` last, naming the kind (hf or gguf), the path to
convert from and the SHA-256 of the inputs. The tiny model is written beside it; a hub model
stays in the Hugging Face cache; local files stay where they are.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ratchet.atomic import write_json
from ratchet.errors import MissingInputError, SourceUnavailableError
from ratchet.paths import RunPaths
from ratchet.tracking import sha256_of

HUB_PATTERNS = ["*.json", "*.safetensors", "merges.txt", "vocab.json", "tokenizer*"]


def _make_tiny(cfg: dict, out: Path) -> Path:
    from ratchet.data.char_tokenizer import save_char_tokenizer
    from ratchet.data.synthetic import ALPHABET
    from ratchet.data.tokenizer import load_tokenizer
    from ratchet.model.tiny import make_tiny_model

    t = cfg["model"]["tiny"]
    tok_dir = out / "tokenizer"
    save_char_tokenizer(tok_dir, ALPHABET)
    tok = load_tokenizer(tok_dir)
    make_tiny_model(out / "hf", seed=cfg["seed"], vocab_size=tok.vocab_size,
                    hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
                    num_layers=t["num_layers"], num_heads=t["num_heads"],
                    num_kv_heads=t["num_kv_heads"], init_std=t["init_std"],
                    tokenizer_dir=tok_dir, eos_token_id=tok.eos_ids[0], pad_token_id=tok.pad_id)
    shutil.rmtree(tok_dir)
    return out / "hf"


def _from_hub(cfg: dict) -> Path:
    """The pinned snapshot in the Hugging Face cache (HF_HOME / HF_HUB_CACHE): downloaded
    once, shared by every run, never copied into results/."""
    from huggingface_hub import snapshot_download

    m = cfg["model"]
    print(f"[download_model] snapshot_download {m['repo_id']}@{m['revision']}")
    try:
        path = snapshot_download(repo_id=m["repo_id"], revision=m["revision"],
                                 allow_patterns=HUB_PATTERNS)
    except Exception as e:  # the hub client's errors are many; name the repo and revision
        raise SourceUnavailableError(f"download_model: cannot get {m['repo_id']}@{m['revision']} from the "
                           f"Hugging Face hub or its cache: {type(e).__name__}: {e}") from e
    return Path(path)


def _check_before_hashing(kind: str, path: Path) -> None:
    """A wrong model (unsupported architecture, inconsistent config) fails here, in a moment,
    not after minutes of hashing and converting."""
    if kind == "gguf":
        from ratchet.model.convert_gguf import check_gguf_architecture

        check_gguf_architecture(path)
    else:
        from ratchet.model.convert_hf import read_hf_config

        read_hf_config(path)


def download_model(cfg: dict, run) -> None:
    paths = RunPaths.from_config(cfg)
    out = paths.source
    source = cfg["model"]["source"]
    if out.exists():
        shutil.rmtree(out)  # a half-written earlier attempt must not be mistaken for a source
    out.mkdir(parents=True)
    if source == "tiny":
        kind, path = "hf", _make_tiny(cfg, out)
    elif source == "hub":
        kind, path = "hf", _from_hub(cfg)
    else:
        path = Path(cfg["model"]["path"]).expanduser().resolve()
        kind = "gguf" if source == "gguf" else "hf"
        if kind == "gguf" and not path.is_file():
            raise MissingInputError(f"config model.path: GGUF file not found: {path}")
        if kind == "hf" and not path.is_dir():
            raise MissingInputError(f"config model.path: model directory not found: {path}")
    _check_before_hashing(kind, path)
    digest = sha256_of(path)
    record = {"kind": kind, "source": source, "path": str(path), "sha256": digest,
              "repo_id": cfg["model"]["repo_id"] if source == "hub" else None,
              "revision": cfg["model"]["revision"] if source == "hub" else None}
    write_json(paths.source_done, record)
    print(f"[download_model] {source}: {path} (sha256 {digest[:16]}...)")
    run.set_tags({"model.sha256": digest, "model.path": str(path)})
    run.log_output(paths.source_done)
