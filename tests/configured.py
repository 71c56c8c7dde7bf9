"""Settings objects for tests, built as the pipeline builds them: from a validated config
(the schema's defaults) with the test's overrides."""

from __future__ import annotations

from ratchet.config import validate

_TOP = {"seed": ("seed",), "engine_dtype": ("engine", "dtype")}


def config_with(section: str, overrides: dict) -> dict:
    """A validated config with `overrides` in `section` (seed and engine_dtype where they live)."""
    cfg: dict = {section: {}}
    for key, value in overrides.items():
        value = list(value) if isinstance(value, tuple) else value
        path = _TOP.get(key)
        if path is None:
            cfg[section][key] = value
        elif len(path) == 1:
            cfg[path[0]] = value
        else:
            cfg.setdefault(path[0], {})[path[1]] = value
    return validate(cfg)


def ablate_settings(**overrides):
    from ratchet.mismatch.ablation import AblateSettings

    return AblateSettings.from_config(config_with("ablate", overrides))

