"""convert.snap_to: the source rounded onto the bf16 grid before storage (the released-bf16
condition), so that the converted weights and the masters built from them lie on that grid,
while the default leaves the conversion as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ratchet import config as config_mod
from ratchet.errors import InputError
from ratchet.model.dtypes import bf16_bits_to_fp32, round_to
from ratchet.model.snap import changed_by_storage, snap_weights

ROOT = Path(__file__).resolve().parents[1]


def convert(results: Path, *overrides: str) -> dict:
    from ratchet.stages import run_stage

    cfg = config_mod.load(ROOT / "config" / "config.yaml", [f"results_dir={results}", *overrides])
    for stage in ("download_model", "convert_weights"):
        run_stage(stage, cfg)
    return cfg


def model_dir(cfg: dict) -> Path:
    from ratchet.paths import RunPaths

    return RunPaths.from_config(cfg).model


def source_weights(cfg: dict) -> dict:
    """The source's fp32 weights in the engine layout, as convert_weights reads them."""
    from ratchet.model.convert_hf import convert_hf
    from ratchet.paths import RunPaths

    record = json.loads(RunPaths.from_config(cfg).source_done.read_text())
    return convert_hf(record["path"])[1]


@pytest.fixture(scope="module")
def conditions(tmp_path_factory):
    import os

    os.environ["RATCHET_TRACKING"] = "off"
    root = tmp_path_factory.mktemp("snap")
    return {name: convert(root / name, *overrides) for name, overrides in
            {"default": (), "bf16": ("convert.snap_to=bf16",), "fp16": ("convert.snap_to=fp16",)}.items()}


def test_bf16_values_in_fp16_change_only_outside_its_normal_range_and_stay_on_the_grid():
    every_bf16 = bf16_bits_to_fp32(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
    values = every_bf16[np.isfinite(every_bf16)]
    with np.errstate(over="ignore", invalid="ignore"):
        stored = round_to(values, "fp16")
        # below its normal range (2**-14) fp16's step is 2**-24
        off_subnormal_step = (np.abs(values) < 2.0 ** -14) & ((values * 2.0 ** 24) % 1 != 0)
    changed = stored != values
    assert np.array_equal(changed, off_subnormal_step | (np.abs(values) > 65504))
    assert not (changed & (np.abs(values) >= 2.0 ** -17) & (np.abs(values) <= 65504)).any()
    finite = np.isfinite(stored)
    assert np.array_equal(round_to(stored[finite], "bf16"), stored[finite])  # still on the bf16 grid
    in_range = values[np.abs(values) <= 65504]
    assert changed_by_storage({"w": in_range}, "fp16") == int(np.count_nonzero(off_subnormal_step)) > 0


def test_snapped_conversion_and_its_masters_lie_on_the_bf16_grid(conditions):
    from ratchet.mismatch.visibility import first_rows, off_grid_share
    from ratchet.model.io import load_engine_model
    from ratchet.trainer.policy import Policy

    snapped = load_engine_model(model_dir(conditions["bf16"]))
    default = load_engine_model(model_dir(conditions["default"]))
    for name, w in snapped.weights.items():
        assert np.array_equal(round_to(w, "bf16"), w), name
    assert off_grid_share(default.weights, "bf16") > 0.5  # the default source lies off the grid

    masters = Policy.from_weights(snapped.cfg, snapped.weights).export_weights()
    assert off_grid_share(masters, "bf16") == 0.0
    rows = {r["dtype"]: r for r in first_rows(masters, ["fp16", "bf16"])}
    assert rows["bf16"]["off_grid_share"] == 0.0 and rows["fp16"]["off_grid_share"] == 0.0

    manifest = json.loads((model_dir(conditions["bf16"]) / "manifest.json").read_text())
    assert manifest["snap_to"] == "bf16"
    # the count is of the snapped source values that the fp16 file does not hold exactly
    want = {k: round_to(w, "bf16") for k, w in source_weights(conditions["bf16"]).items()}
    differ = sum(int(np.count_nonzero(snapped.weights[k] != w)) for k, w in want.items())
    assert manifest["snap_changed_by_storage"] == differ


def test_the_default_conversion_is_the_source_stored_in_fp16_with_no_snap_keys(conditions):
    from ratchet.model.io import load_engine_model

    cfg = conditions["default"]
    manifest = json.loads((model_dir(cfg) / "manifest.json").read_text())
    assert not {"snap_to", "snap_changed_by_storage"} & manifest.keys()
    stored = load_engine_model(model_dir(cfg)).weights
    for name, w in source_weights(cfg).items():
        assert np.array_equal(stored[name], round_to(w, "fp16")), name
    # snapping to the grid the file is stored on anyway changes no byte of it
    fp16 = json.loads((model_dir(conditions["fp16"]) / "manifest.json").read_text())
    assert fp16["file_sha256"] == manifest["file_sha256"] and fp16["snap_changed_by_storage"] == 0


def test_the_setting_is_part_of_the_convert_stage_settings(conditions):
    from ratchet.stages.registry import settings

    assert settings("convert_weights", conditions["bf16"])["convert"] == {"snap_to": "bf16"}
    assert settings("convert_weights", conditions["default"])["convert"] == {"snap_to": None}


def test_an_unknown_grid_names_the_key():
    with pytest.raises(config_mod.ConfigError, match=r"convert\.snap_to.*'bf8'"):
        config_mod.load(None, ["convert.snap_to=bf8"])
    with pytest.raises(InputError, match=r"convert\.snap_to.*'int8'"):
        snap_weights({"w": np.zeros(2, np.float32)}, "int8")
    weights = {"w": np.float32([1.0 + 2.0 ** -10])}
    assert snap_weights(weights, None) is weights
    assert snap_weights(weights, "bf16")["w"][0] == 1.0
