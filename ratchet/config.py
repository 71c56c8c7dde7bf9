"""Pipeline configuration: a YAML profile and `key=value` overrides, validated against the one
schema that Snakemake also reads (package data, so an installed wheel has it), so that a bad
key stops the run before any work starts, with the key named."""

from __future__ import annotations

import copy
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ratchet.errors import InputError

SCHEMA_PATH = Path(str(resources.files("ratchet") / "schemas" / "config.schema.yaml"))


class ConfigError(InputError):
    """A configuration problem, with the dotted key that causes it in the message."""


def load_schema() -> dict:
    if not SCHEMA_PATH.is_file():
        raise FileNotFoundError(f"config schema not found: {SCHEMA_PATH}")
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _fill_defaults(schema: dict, cfg: dict) -> None:
    for key, sub in schema.get("properties", {}).items():
        if key not in cfg and "default" in sub:
            cfg[key] = copy.deepcopy(sub["default"])
        if isinstance(cfg.get(key), dict) and sub.get("type") == "object":
            _fill_defaults(sub, cfg[key])


def _message(err: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        key = ".".join(filter(None, [where, extra[0] if extra else "?"]))
        jobs = " or a job of one of them by its label (ablate_fix_run-exact)" if err.schema.get("patternProperties") else ""
        return f"config: unknown key {key!r} (allowed here: {', '.join(allowed)}{jobs})"
    if err.validator == "type":
        return (f"config: key {where!r} must be of type {err.validator_value}, "
                f"got {type(err.instance).__name__} {err.instance!r}")
    return f"config: key {where or '<root>'!r}: {err.message}"


def validate(cfg: dict) -> dict:
    """Return a deep copy of `cfg` with every default filled; raise ConfigError on bad input."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(cfg).__name__}")
    schema = load_schema()
    cfg = coerce_strings(schema, copy.deepcopy(cfg))
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(_message(errors[0]))
    _fill_defaults(schema, cfg)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:  # a default that does not satisfy its own schema is a bug in the schema
        raise ConfigError(_message(errors[0]))
    _check_consistency(cfg)
    return cfg


def coerce_strings(schema: dict, value: Any) -> Any:
    """Strings where the schema wants no string, parsed as YAML scalars or lists: Snakemake's
    `--config 'train={"steps": 10}'` hands every nested value over as a string. A string that
    does not parse to the wanted type stays a string, so validation names its key."""
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if isinstance(value, dict) and "properties" in schema:
        return {k: coerce_strings(schema["properties"].get(k, {}), v) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce_strings(schema["items"], v) for v in value]
    if types == ["string"] and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # `run_name=2024` (or `run_name: 2024` in YAML) read as a number
    if isinstance(value, str) and types and "string" not in types:
        try:
            parsed = parse_value(value)
        except yaml.YAMLError:
            return value
        if parsed is not None or "null" in types:
            return coerce_strings(schema, parsed) if isinstance(parsed, (list, dict)) else parsed
    return value


def _check_consistency(cfg: dict) -> None:
    """Rules that span keys, which JSON Schema states badly."""
    m, d = cfg["model"], cfg["data"]
    if m["source"] in ("local", "gguf") and not m["path"]:
        raise ConfigError(f"config: key 'model.path' is required when model.source is {m['source']!r}")
    if d["source"] == "local" and not (d["train_path"] and d["test_path"]):
        raise ConfigError("config: keys 'data.train_path' and 'data.test_path' are required "
                          "when data.source is 'local'")
    if (m["source"] == "tiny") != (d["source"] == "synthetic"):
        raise ConfigError("config: model.source 'tiny' goes with data.source 'synthetic' (its "
                          "character vocabulary is the task's) and only with it; got "
                          f"model.source={m['source']!r}, data.source={d['source']!r}")
    t = m["tiny"]
    if t["num_heads"] % t["num_kv_heads"] or t["hidden_size"] % t["num_heads"]:
        raise ConfigError("config: key 'model.tiny': num_heads must divide hidden_size and be a "
                          "multiple of num_kv_heads")


def parse_value(text: str) -> Any:
    """`3` -> 3, `1e-6` -> 1e-06, `null` -> None, `[1, 2]` -> [1, 2], anything else a string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return yaml.safe_load(text) if text.strip() else text


def apply_overrides(cfg: dict, overrides: list[str]) -> dict:
    cfg = copy.deepcopy(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"config override {item!r} is not of the form key=value")
        key, text = item.split("=", 1)
        node = cfg
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config override {item!r}: {part!r} is not a section")
        node[parts[-1]] = parse_value(text)
    return cfg


def set_overrides(text) -> list[str]:
    """`--config set='train.steps=10 data.train_path="/my data/t.jsonl"'` as key=value items,
    split as a shell splits them (quotes keep spaces)."""
    try:
        return shlex.split(str(text or ""))
    except ValueError as e:
        raise ConfigError(f"config set={text!r}: {e} (Snakemake drops a quote that ends the whole "
                          "--config value: put the quoted item before another one, or end with a "
                          "space inside the outer quotes)") from None


def load(path: str | Path | None, overrides: list[str] = ()) -> dict:
    """Read a YAML profile (or start empty), apply overrides, validate."""
    cfg: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            cfg = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    return validate(apply_overrides(cfg, list(overrides)))
