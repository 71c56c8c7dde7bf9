"""The command line and the config as a user meets them: help per stage, overrides from
Snakemake's --config, one resolved config inside and outside the pipeline, and a stage run
by hand that cannot silently corrupt a pipeline's results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from snakemake_run import clean_env, run_snakemake

from ratchet import cli
from ratchet.config import ConfigError, load, set_overrides, validate
from ratchet.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    return clean_env(**{"RATCHET_TRACKING": "off", **extra})


def test_no_arguments_prints_the_stages_not_an_error(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert "required" not in out and all(name in out for name in STAGES)


def test_stage_help_says_what_it_reads_writes_and_depends_on(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train_colocated", "--help"])
    out = capsys.readouterr().out
    assert "<results_dir>/<run_name>/engine/build.json" in out  # reads
    assert "<results_dir>/<run_name>/train/colocated/metrics.parquet" in out  # writes
    assert "data, engine, eval, train" in out  # config sections


def test_an_unknown_stage_exits_2(capsys):
    assert cli.main(["trian_colocated"]) == 2
    assert "unknown stage 'trian_colocated'" in capsys.readouterr().err


def test_nested_values_from_snakemake_are_coerced_by_the_schema():
    cfg = validate({"train": {"steps": "10", "lr": "1e-4", "round_weights": "true", "betas": "[0.8, 0.9]",
                              "split": {"ahead": "0"}}, "eval": {"num_problems": "null"}})
    t = cfg["train"]
    assert (t["steps"], t["lr"], t["round_weights"], t["betas"], t["split"]["ahead"]) == (10, 1e-4, True, [0.8, 0.9], 0)
    assert cfg["eval"]["num_problems"] is None
    with pytest.raises(ConfigError, match="train.steps"):
        validate({"train": {"steps": "abc"}})
    assert validate({"run_name": "12"})["run_name"] == "12"  # a string key stays a string


def _snakemake_config(workdir: Path, *args: str) -> dict:
    """The config a Snakemake invocation resolves, as its first job sees it."""
    proc = run_snakemake(workdir, *args, "--", "resolved_config", env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = next(p for p in (workdir / "results").iterdir() if (p / "config.json").is_file())  # not .pipelines
    return json.loads((run / "config.json").read_text())


@pytest.mark.parametrize("profile", ["config.yaml", "paper.yaml", "local.yaml", "local-1.5b.yaml"])
def test_a_profile_resolves_the_same_inside_and_outside_the_pipeline(tmp_path, profile):
    path = ROOT / "config" / profile
    insist = [] if profile == "config.yaml" else ["engine.backend=numpy"]  # these profiles want a GPU
    inside = _snakemake_config(tmp_path, "--configfile", str(path),
                               *(["--config", f"set={' '.join(insist)}"] if insist else []))
    assert inside == load(path, insist)


def test_snakemake_overrides_nested_and_dotted(tmp_path):
    inside = _snakemake_config(tmp_path, "--config", 'train={"steps": "10", "lr": "1e-4"}',
                               "set=eval.num_problems=50 ablate.updates=[0,3]")
    assert inside == load(ROOT / "config" / "config.yaml",
                          ["train.steps=10", "train.lr=1e-4", "eval.num_problems=50", "ablate.updates=[0,3]"])


def _ratchet(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ratchet", *args], capture_output=True, text=True,
                          env=_env(), cwd=workdir, timeout=300)


def test_a_stage_run_before_its_inputs_names_the_rule_that_makes_them(tmp_path):
    proc = _ratchet(tmp_path, "convert_weights")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("ratchet: convert_weights: input results/tiny/source/source.json does not "
                                   "exist; run `snakemake download_model` (or `ratchet download_model`) first")


def test_a_job_stage_the_config_asks_nothing_of_says_so(tmp_path, capsys):
    """Without ablate.parallel_jobs ablate_decompose measures the gradients: their job stage is
    one line's error, not a silent success."""
    assert cli.main(["ablate_gradient_run", f"results_dir={tmp_path}", "ablate.parallel_jobs=false"]) == 2
    assert capsys.readouterr().err.strip() == "ratchet: ablate_gradient_run: the config asks for no job of it"


@pytest.mark.slow
def test_a_hand_run_stage_does_not_overwrite_outputs_of_other_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the stages eval_baseline reads: by hand too, in this process
    for name in [k for k in os.environ if k.startswith(("RATCHET_", "MLFLOW_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RATCHET_TRACKING", "off")
    for stage in ("download_model", "download_data", "convert_weights", "build_engine"):
        assert cli.main([stage, "eval.num_problems=20"]) == 0, stage
    assert _ratchet(tmp_path, "eval_baseline", "eval.num_problems=20").returncode == 0
    baseline = tmp_path / "results" / "tiny" / "eval" / "baseline.json"
    before = baseline.read_bytes()
    proc = _ratchet(tmp_path, "eval_baseline", "eval.num_problems=10")
    assert proc.returncode == 2
    assert "baseline.json was made under other settings (eval.num_problems: 20 -> 10)" in proc.stderr
    assert baseline.read_bytes() == before
    assert _ratchet(tmp_path, "eval_baseline", "eval.num_problems=20").returncode == 0  # same settings
    assert _ratchet(tmp_path, "eval_baseline", "eval.num_problems=10", "--force").returncode == 0
    assert json.loads(baseline.read_text())["n"] == 10


def test_two_writers_of_one_run_directory_are_refused(tmp_path):
    from ratchet.errors import InputError
    from ratchet.stages.guard import run_directory_lock

    cfg = validate({"results_dir": str(tmp_path)})
    with run_directory_lock(cfg, exclusive=False), run_directory_lock(cfg, exclusive=False):
        pass  # the pipeline's jobs share it
    with run_directory_lock(cfg, exclusive=True):
        with pytest.raises(InputError, match="is being written by another process"):
            with run_directory_lock(cfg, exclusive=False):
                pass
    with run_directory_lock(cfg, exclusive=False):
        with pytest.raises(InputError, match="is being written by another process"):
            with run_directory_lock(cfg, exclusive=True):
                pass


def test_keys_that_disagree_stop_the_pipeline_before_its_first_rule(tmp_path):
    """Rules spanning keys used to be checked only when the training or ablation ran, after
    download, conversion and the baseline eval, as a traceback."""
    proc = run_snakemake(tmp_path, "-n", "--config", "set=train.mis_low=3 train.mis_high=2", env=_env(), timeout=300)
    assert proc.returncode != 0
    assert "ratchet: config train: mis_low 3 is above mis_high 2" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "results").exists()


@pytest.mark.parametrize("overrides, message", [
    (["train.num_workers=2", "train.problems_per_step=3"],
     "config train: problems_per_step 3 must be a multiple of num_workers 2"),
    (["train.exact_forward=true", "train.round_weights=false"], "config train: exact_forward needs round_weights"),
    (["ablate.mis_low=3", "ablate.mis_high=2"], "config ablate: mis_low 3 is above mis_high 2"),
])
def test_a_stage_run_by_hand_names_keys_that_disagree_in_one_line(tmp_path, capsys, overrides, message):
    assert cli.main(["train_colocated", f"results_dir={tmp_path}", *overrides]) == 2
    assert capsys.readouterr().err.strip().startswith(f"ratchet: {message}")
    assert not any(tmp_path.iterdir())  # nothing ran


def test_an_unbalanced_quote_in_set_names_set_and_the_way_out():
    """Snakemake drops the quote that ends a whole --config value, so set='... b="x y"' arrives
    unbalanced; shlex's own "No closing quotation" named nothing."""
    with pytest.raises(ConfigError, match=r"config set=.*No closing quotation.*before another one"):
        set_overrides("train.steps=3 data.train_path='/my data/t.jsonl")
    assert set_overrides("data.train_path='/my data/t.jsonl' train.steps=3") == [
        "data.train_path=/my data/t.jsonl", "train.steps=3"]


def test_config_out_to_a_directory_is_one_line_and_leaves_no_temporary(tmp_path, capsys):
    target = tmp_path / "here"
    target.mkdir()
    assert cli.main(["config", "--out", str(target)]) == 2
    assert capsys.readouterr().err.strip() == f"ratchet: config --out {target}: is a directory (give a file's path)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]


def test_a_failed_atomic_write_removes_its_temporary(tmp_path):
    from ratchet.atomic import write_text

    (tmp_path / "out.json").mkdir()  # the rename onto it fails
    with pytest.raises(OSError):
        write_text(tmp_path / "out.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
