"""One source for every default: the schema. The settings dataclasses have no defaults of
their own, every field maps to a schema key, and a config of nothing but defaults gives the
schema's values."""

from __future__ import annotations

import dataclasses

import pytest

from ratchet.config import load_schema, validate
from ratchet.mismatch.ablation import AblateSettings
from ratchet.rl.settings import GRPOConfig


def schema_default(key: tuple[str, ...]):
    node = load_schema()
    for part in key:
        node = node["properties"][part]
    return node["default"]


@pytest.mark.parametrize("cls", [GRPOConfig, AblateSettings])
def test_every_field_maps_to_a_schema_key_and_has_no_default(cls):
    for f in dataclasses.fields(cls):
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, \
            f"{cls.__name__}.{f.name} has a default of its own: the schema holds it"
        schema_default(cls.schema_key(f.name))  # raises KeyError when the schema lacks the key


@pytest.mark.parametrize("cls", [GRPOConfig, AblateSettings])
def test_defaults_are_the_schemas(cls):
    settings = cls.from_config(validate({}))
    for f in dataclasses.fields(cls):
        key = cls.schema_key(f.name)
        value = getattr(settings, f.name)
        if key == ("train",):  # the ablations' base GRPO settings: the train section's
            assert value == GRPOConfig.from_config(validate({})), f.name
            continue
        want = schema_default(key)
        if f.name == "gradient_updates" and want is None:  # null: the updates
            want = schema_default(("ablate", "updates"))
        if f.name in ("updates", "gradient_updates"):  # kept sorted and unique
            want = sorted(set(want))
        assert (list(value) if isinstance(value, tuple) else value) == want, (cls.__name__, f.name)


def test_the_ablation_runs_take_the_profiles_train_settings():
    cfg = validate({"train": {"max_grad_norm": 0.5, "is_correction": "mis"}, "ablate": {"lr": 3e-6}})
    settings = AblateSettings.from_config(cfg)
    none, tis, exact = (settings.grpo(run) for run in ("none", "tis", "exact"))
    assert none.max_grad_norm == 0.5 and none.lr == 3e-6 and none.is_correction == "none"
    assert tis.is_correction == "tis" and not tis.round_weights
    assert exact.round_weights and exact.exact_forward
    assert none.max_new_tokens == schema_default(("ablate", "max_new_tokens"))


def test_the_ablation_runs_keep_their_own_arithmetic_whatever_the_trainings_use():
    """train.compute_dtype fp16 speeds the trainings up; the remedies stay defined against an
    fp32 forward unless ablate.compute_dtype says otherwise."""
    settings = AblateSettings.from_config(validate({"train": {"compute_dtype": "fp16"}}))
    assert settings.train.compute_dtype == "fp16"
    assert {settings.grpo(run).compute_dtype for run in ("none", "fix", "exact", "tis", "mis")} == {"fp32"}
    bf16 = AblateSettings.from_config(validate({"train": {"compute_dtype": "fp16"}, "ablate": {"compute_dtype": "bf16"}}))
    assert bf16.grpo("fix").compute_dtype == "bf16"
