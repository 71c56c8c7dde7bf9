"""Shared test fixtures: paths to optional real artefacts, and GPU skipping."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REAL_GGUF = ROOT / ".cache" / "real" / "qwen2.5-coder-0.5b-instruct.gguf"


def has_cuda() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs CUDA and CuPy (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def real_gguf() -> Path:
    path = Path(os.environ.get("RATCHET_REAL_GGUF", REAL_GGUF))
    if not path.is_file():
        pytest.skip(f"real model not present at {path} (run ../shared/tools/real-model.sh .cache/real)")
    return path


@pytest.fixture
def real_gguf_15() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct (`../shared/tools/real-model.sh .cache/real --model coder-1.5b`)."""
    path = Path(os.environ.get("RATCHET_REAL_GGUF_15", REAL_GGUF.parent / "qwen2.5-coder-1.5b-instruct.gguf"))
    if not path.is_file():
        pytest.skip(f"1.5B model not present at {path} (run ../shared/tools/real-model.sh .cache/real "
                    "--model coder-1.5b)")
    return path


@pytest.fixture
def gsm8k_dir() -> Path:
    path = SHARED / "data" / "gsm8k"
    if not (path / "test.jsonl").is_file():
        pytest.skip(f"GSM8K not present at {path}")
    return path


@pytest.fixture
def console_last_line(monkeypatch):
    """The progress console (ratchet.progress) captured: call it for the last line drawn."""
    import io

    from ratchet import progress

    shown = io.StringIO()
    monkeypatch.setattr(progress, "_console", shown)
    return lambda: shown.getvalue().replace("\r", "\n").strip().splitlines()[-1]


@pytest.fixture(autouse=True)
def _torch_determinism_restored():
    """A training in-process turns torch's deterministic mode on for good (set_determinism);
    each test gets back the mode it found, so no test depends on the ones before it."""
    import sys

    torch = sys.modules.get("torch")  # not imported for a test that needs no torch
    was = torch.are_deterministic_algorithms_enabled() if torch is not None else False
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.use_deterministic_algorithms(was)


PREPARE = ("download_model", "download_data", "convert_weights", "build_engine")


@pytest.fixture(scope="session")
def _prepared_results(tmp_path_factory) -> Path:
    """The default profile's stages before training (its model, data and built engine), run
    once a session (once per xdist worker) with tracking off."""
    from ratchet import config as config_mod
    from ratchet.stages import run_stage

    results = tmp_path_factory.mktemp("prepared") / "results"
    cfg = config_mod.load(ROOT / "config" / "config.yaml", [f"results_dir={results}"])
    tracking = os.environ.get("RATCHET_TRACKING")
    os.environ["RATCHET_TRACKING"] = "off"
    try:
        for stage in PREPARE:
            run_stage(stage, cfg)
    finally:
        if tracking is None:
            os.environ.pop("RATCHET_TRACKING")
        else:
            os.environ["RATCHET_TRACKING"] = tracking
    return results


@pytest.fixture(scope="session")
def prepare(_prepared_results):
    """prepare(results, *overrides) -> cfg: the default profile with `overrides` (none that
    change the stages before training: model, data, convert, engine), results_dir `results`,
    holding a copy of the session's prepared model, data and engine build, with tracking off
    (os.environ, as the stages read it) as a training run by hand has it."""
    from ratchet import config as config_mod

    def prepare(results: Path, *overrides: str) -> dict:
        os.environ["RATCHET_TRACKING"] = "off"
        cfg = config_mod.load(ROOT / "config" / "config.yaml", [f"results_dir={results}", *overrides])
        default = config_mod.load(ROOT / "config" / "config.yaml")
        changed = {k for k in ("model", "data", "convert", "engine", "seed", "run_name") if cfg[k] != default[k]}
        assert not changed, f"prepare: overrides of {sorted(changed)} need stages run afresh"
        shutil.copytree(_prepared_results, results, symlinks=True)
        return cfg

    return prepare
