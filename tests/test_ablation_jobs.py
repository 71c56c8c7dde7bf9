"""The ablations as jobs (one remedy of ablate_fix, one engine dtype of the gradients, each in
a process of its own so that a GPU runs them side by side): each job alone gives the bits it
gives in one process that runs them all in turn, and the gathered tables are those of that
one process, row for row."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from configured import ablate_settings
from tiny_setup import tiny_setup

from ratchet.config import validate
from ratchet.errors import MissingInputError
from ratchet.mismatch.decompose import along_updates
from ratchet.mismatch.fix import fix_run, fix_runs, gather
from ratchet.mismatch.gradient import gather_dtypes

SETTINGS = dict(updates=(0, 2), num_rollouts=8, max_new_tokens=4, problems_per_step=4, group_size=8,
                lr=1e-6, engine_dtypes=("fp16", "bf16"), max_steps_per_update=30, seed=0,
                engine_dtype="fp16", micro_batch_size=5, fix_steps=4, fix_runs=("none", "exact", "tis"))


@pytest.fixture
def fresh(tmp_path_factory):
    """A new tiny Setup a call, as a job's process starts from (nothing cached or shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield lambda: tiny_setup(tmp_path_factory.mktemp("tiny"), num_measure=8, with_eval=True)
    torch.set_num_threads(threads)


def test_a_fix_run_alone_gives_the_bits_of_the_runs_in_turn(fresh):
    settings = ablate_settings(**SETTINGS)
    steps, runs = fix_runs(fresh(), settings)
    alone = [fix_run(fresh(), settings, name) for name in reversed(settings.fix_runs)][::-1]
    assert gather([s for s, _ in alone]).equals(steps) and gather([r for _, r in alone]).equals(runs)
    assert list(runs["run"]) == list(settings.fix_runs) and runs["eval_n"].gt(0).all()
    assert (steps.groupby("run", sort=False).size() == settings.fix_steps).all()


def test_the_gradient_a_dtype_at_a_time_gathers_to_the_table_of_one_run(fresh):
    settings = ablate_settings(**SETTINGS)
    whole = along_updates(fresh(), settings, visibility_updates=0, measure_at=(),
                          gradient_at=settings.gradient_updates)[2]
    parts = [along_updates(fresh(), settings, visibility_updates=0, measure_at=(),
                           gradient_at=settings.gradient_updates, gradient_dtypes=(d,))[2]
             for d in ("bf16", "fp16")]  # in either order: each part is its own run
    assert gather_dtypes(parts[::-1]).equals(whole)
    assert list(whole["engine_dtype"].iloc[:2]) == ["fp16", "fp16"] and set(whole["updates"]) == {0, 2}


def test_a_gather_without_its_jobs_names_the_command_that_makes_them(tmp_path):
    from ratchet.stages.ablate import ablate_fix, ablate_gradient

    cfg = validate({"results_dir": str(tmp_path), "ablate": {"fix_runs": ["none", "tis"]}})
    with pytest.raises(MissingInputError, match=r"ablate_fix: input .*fix/none/steps\.parquet does not "
                                                r"exist; run `snakemake ablate_fix` \(or `ratchet "
                                                r"ablate_fix_run --job remedy=none`\)"):
        ablate_fix(cfg, run=None)
    with pytest.raises(MissingInputError, match=r"ablate_gradient_run --job dtype=fp16"):
        ablate_gradient(cfg, run=None)
    alone = validate({"results_dir": str(tmp_path), "ablate": {"parallel_jobs": False}})
    with pytest.raises(MissingInputError, match=r"gradient/all\.parquet does not exist; run `snakemake "
                                                r"ablate_gradient` \(or `ratchet ablate_decompose`\)"):
        ablate_gradient(alone, run=None)


def test_a_job_that_is_no_remedy_or_dtype_is_one_clear_error(tmp_path):
    """Before it reads anything (there is nothing to read here)."""
    from ratchet.stages import ablate

    cfg = validate({"results_dir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"remedy='fast' is not one of \('none', 'fix', 'exact', 'tis', 'mis', 'all'\)"):
        ablate.ablate_fix_run(cfg, None, remedy="fast")
    with pytest.raises(ValueError, match=r"dtype='fp8' is not one of \('fp16', 'bf16', 'fp32'\)"):
        ablate.ablate_gradient_run(cfg, None, dtype="fp8")


def test_gathering_keeps_the_order_asked_for():
    a = pd.DataFrame({"updates": [0, 3], "engine_dtype": ["fp16"] * 2, "v": [1, 2]})
    b = pd.DataFrame({"updates": [0, 3], "engine_dtype": ["bf16"] * 2, "v": [3, 4]})
    assert list(gather_dtypes([a, b])["v"]) == [1, 3, 2, 4]
    assert list(gather([b, a])["v"]) == [3, 4, 1, 2]


def _dry_run_jobs(workdir, *config: str) -> dict[str, int]:
    """{rule: its jobs} in a dry run of `all` on the tiny default with `config` set."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "MLFLOW_"))}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(root / "Snakefile"),
                           "--directory", str(workdir), "--configfile", str(root / "config" / "config.yaml"),
                           "-n", "--cores", "1", "--config", f"set={' '.join(config)}", "--", "all"],
                          capture_output=True, text=True, env={**env, "RATCHET_TRACKING": "off"}, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", proc.stdout, re.MULTILINE)}


def test_parallel_jobs_makes_a_job_a_remedy_and_a_dtype_and_off_one_of_each(tmp_path):
    on = _dry_run_jobs(tmp_path / "on", "ablate.parallel_jobs=true", "ablate.fix_runs=[none,fix,tis]")
    off = _dry_run_jobs(tmp_path / "off", "ablate.parallel_jobs=false")
    assert (on["ablate_fix_run"], on["ablate_gradient_run"]) == (3, 2)
    # off: one fix job, and the gradients measured along ablate_decompose's own run (no replay)
    assert off["ablate_fix_run"] == 1 and "ablate_gradient_run" not in off
    assert on["ablate_fix"] == off["ablate_fix"] == on["ablate_gradient"] == off["ablate_gradient"] == 1
    assert on["ablate_decompose"] == off["ablate_decompose"] == 1


def test_parallel_fix_runs_makes_a_job_a_remedy_and_keeps_the_gradients_along_the_run(tmp_path):
    jobs = _dry_run_jobs(tmp_path, "ablate.parallel_jobs=fix_runs", "ablate.fix_runs=[none,fix,tis]")
    assert jobs["ablate_fix_run"] == 3 and "ablate_gradient_run" not in jobs
    assert jobs["ablate_decompose"] == jobs["ablate_fix"] == jobs["ablate_gradient"] == 1


def test_parallel_jobs_takes_only_its_three_values():
    from ratchet.config import ConfigError

    assert validate({"ablate": {"parallel_jobs": "fix_runs"}})["ablate"]["parallel_jobs"] == "fix_runs"
    with pytest.raises(ConfigError, match="parallel_jobs"):
        validate({"ablate": {"parallel_jobs": "gradients"}})


@pytest.mark.slow
def test_either_way_the_stages_write_the_same_tables(tmp_path, monkeypatch):
    """The stages as the pipeline runs them, a job a remedy and a dtype, then one job of each,
    then a job a remedy with the gradients along ablate_decompose's run: every table the same
    bytes."""
    import hashlib

    from ratchet.paths import RunPaths
    from ratchet.stages import run_stage
    from ratchet.stages.registry import stage_jobs

    monkeypatch.setenv("RATCHET_TRACKING", "off")
    monkeypatch.delenv("RATCHET_PIPELINE_ID", raising=False)
    base = {"results_dir": str(tmp_path), "model": {"tiny": {"init_std": 0.1}}, "eval": {"max_new_tokens": 2},
            "ablate": {"updates": [0, 1], "visibility_updates": 1, "fix_steps": 2, "num_rollouts": 8,
                       "max_new_tokens": 2, "eval_problems": 10, "fix_runs": ["none", "exact", "tis"]}}
    digests = []
    for parallel in (True, False, "fix_runs"):
        cfg = validate({**base, "run_name": f"parallel-{parallel}",
                        "ablate": {**base["ablate"], "parallel_jobs": parallel}})
        for stage in ("download_model", "download_data", "convert_weights", "build_engine", "ablate_decompose"):
            run_stage(stage, cfg)
        for stage in ("ablate_fix_run", "ablate_gradient_run"):
            for job in stage_jobs(stage, cfg):  # none of the second without parallel_jobs
                run_stage(stage, cfg, job=job)
        for stage in ("ablate_fix", "ablate_gradient"):
            run_stage(stage, cfg)
        paths = RunPaths.from_config(cfg)
        digests.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                        for p in (paths.fix_table, paths.fix_steps, paths.gradient_table,
                                  paths.decompose_table, paths.visibility_table)})
    assert digests[0] == digests[1] == digests[2]
