"""The package as a user installs it: a wheel in a fresh virtualenv, away from the checkout,
finds its kernels and schema, validates a config and runs the tiny first stages from an
empty directory, giving the same converted model as the checkout does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what a stage run must not inherit from the test's environment
SCRUBBED = ("PYTHONPATH", "RATCHET_KERNEL_DIR", "RATCHET_CONFIG_JSON", "RATCHET_PIPELINE_ID",
            "MLFLOW_TRACKING_URI", "RATCHET_TRACKING")

PROBE = """
import json, sys
from importlib import resources
import ratchet
from ratchet import config
from ratchet.engine.cuda import loader
print(json.dumps({
    "ratchet": ratchet.__file__,
    "kernel_dir": str(loader.KERNEL_DIR),
    "kernels": loader.source_hashes(),
    "headers": sorted(p.name for p in loader.KERNEL_DIR.glob("*.cuh")),
    "schema": str(resources.files("ratchet") / "schemas" / "config.schema.yaml"),
    "run_name": config.load(sys.argv[1])["run_name"],
}))
"""


def run(cmd: list, cwd: Path, env: dict | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def build_wheel(work: Path) -> Path:
    """The wheel of a copy of the project (the build writes beside its sources), dev/ and
    tests/ included in the copy so that the wheel is seen to leave them out."""
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("ratchet", "dev", "tests"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", work / "dist", src], cwd=work)
    (wheel,) = (work / "dist").glob("ratchet-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"ratchet", wheel.name.split("-py")[0] + ".dist-info"}, tops
    return wheel


def fresh_venv(work: Path, wheel: Path) -> Path:
    """A virtualenv holding only the wheel, then this environment's site-packages appended
    through a .pth line for the dependencies (a plain path: the editable install's own .pth
    files there are not run, so the checkout stays off sys.path)."""
    venv = work / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=work)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], cwd=work)
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=work).strip())
    (site / "outer_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.mark.slow
def test_wheel_installs_and_runs_the_tiny_stages_from_an_empty_directory(tmp_path, monkeypatch):
    venv = fresh_venv(tmp_path, build_wheel(tmp_path))
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    shutil.copy2(ROOT / "config" / "config.yaml", empty / "config.yaml")
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"

    probe = json.loads(run([venv / "bin" / "python", "-c", PROBE, "config.yaml"], empty, env))
    assert Path(probe["ratchet"]).is_relative_to(venv), probe["ratchet"]
    assert Path(probe["kernel_dir"]).is_relative_to(venv) and Path(probe["schema"]).is_relative_to(venv)
    assert Path(probe["schema"]).is_file()
    from ratchet.engine.cuda import loader  # the checkout's: every source and header shipped, unchanged

    assert probe["kernels"] == loader.source_hashes()
    assert probe["headers"] == sorted(p.name for p in loader.KERNEL_DIR.glob("*.cuh"))
    assert probe["run_name"] == "tiny"

    for stage in ("download_model", "convert_weights"):
        run([venv / "bin" / "ratchet", stage, "--config", "config.yaml"], empty, env)
    model = empty / "results" / "tiny" / "model"
    for name in ("model.safetensors", "manifest.json", "config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (model / name).is_file(), name

    # the same stages from the checkout, in-process: the same tensors, bit for bit
    from ratchet import config
    from ratchet.stages import run_stage

    cfg = config.load(ROOT / "config" / "config.yaml", [f"results_dir={tmp_path / 'checkout'}"])
    monkeypatch.setenv("RATCHET_TRACKING", "off")
    for stage in ("download_model", "convert_weights"):
        run_stage(stage, cfg)
    ours = json.loads((tmp_path / "checkout" / "tiny" / "model" / "manifest.json").read_text())
    installed = json.loads((model / "manifest.json").read_text())
    assert installed["file_sha256"] == ours["file_sha256"]

    # tracked from outside a git checkout: the code version says so, the package's is installed
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{empty / 'results' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ratchet").experiment_id])
    assert sorted(r.data.tags["ratchet.stage"] for r in runs) == ["convert_weights", "download_model"]
    assert all(r.data.tags["git.commit"] == "unknown" and r.info.status == "FINISHED" for r in runs)
