"""Checkpoints: the files, the optimiser round trip, and resuming bit for bit (a SIGKILLed
`python -m ratchet train_colocated`, and a split run restarted from an older checkpoint)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from ratchet import config as config_mod
from ratchet.rl.checkpoint import (CheckpointWriter, clean_temporaries, latest_checkpoint, list_checkpoints,
                                   load_checkpoint, load_optimizer, load_rng, optimizer_tensors, read_state,
                                   rng_tensors, save_checkpoint)
from ratchet.stages.verify import trace_divergence

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- files
def test_save_load_latest_and_pruning(tmp_path):
    tensors = {"policy": {"a.weight": torch.randn(3, 4)}, "rng": {"torch_cpu": torch.get_rng_state()}}
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, tensors, {"digest": "x", "rows": [{"step": step}]}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000004", "step-000006"]
    got, state = load_checkpoint(latest_checkpoint(tmp_path, "x"))
    assert state["step"] == 6 and state["rows"] == [{"step": 6}]
    assert torch.equal(got["policy"]["a.weight"], tensors["policy"]["a.weight"])
    assert torch.equal(got["rng"]["torch_cpu"], tensors["rng"]["torch_cpu"])
    assert latest_checkpoint(tmp_path, "other settings") is None
    # a half-written checkpoint (killed before the rename) is neither listed nor kept
    (tmp_path / ".step-000008.tmp-123").mkdir()
    (tmp_path / "step-000010").mkdir()  # no state.json: not whole
    assert latest_checkpoint(tmp_path).name == "step-000006"
    clean_temporaries(tmp_path)
    assert not (tmp_path / ".step-000008.tmp-123").exists()
    # no pickle anywhere: safetensors and JSON only
    assert {p.suffix for p in (tmp_path / "step-000006").iterdir()} == {".safetensors", ".json"}


def test_a_run_keeps_its_own_checkpoints_beside_a_stale_runs_later_ones(tmp_path, capsys):
    """A killed run under other settings left steps 8 and 10; pruning by step alone removed
    this run's step 2 and 4 as they were written, so a kill after them started over."""
    tensors = {"policy": {"a.weight": torch.zeros(2)}}
    for step in (8, 10):
        save_checkpoint(tmp_path, step, tensors, {"digest": "old settings"}, keep=2)
    save_checkpoint(tmp_path, 2, tensors, {"digest": "new"}, keep=2)
    assert "removed 2 checkpoint(s) of an earlier run" in capsys.readouterr().out
    save_checkpoint(tmp_path, 4, tensors, {"digest": "new"}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000004"]
    assert latest_checkpoint(tmp_path, "new").name == "step-000004"
    # a fresh run under the same settings (resume off) replaces an earlier one's later steps too
    save_checkpoint(tmp_path, 9, tensors, {"digest": "new"}, keep=2)
    save_checkpoint(tmp_path, 3, tensors, {"digest": "new"}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000003"]
    save_checkpoint(tmp_path, 5, tensors, {"digest": "new"}, keep=3)
    save_checkpoint(tmp_path, 7, tensors, {"digest": "new"}, keep=3)
    save_checkpoint(tmp_path, 9, tensors, {"digest": "new"}, keep=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000005", "step-000007", "step-000009"]


def test_a_checkpoint_written_behind_the_run_is_the_one_written_in_place(tmp_path, monkeypatch, capsys):
    """CheckpointWriter takes the tensors and the state as they are when asked (the run goes
    on changing both while the thread writes), writes the same files as save_checkpoint, keeps
    as many, says when each is written, and raises a failed write at the next wait."""
    weights = torch.randn(64, 32)
    rows = [{"step": 1}]
    tensors = {"policy": {"a.weight": weights}, "rng": {"torch_cpu": torch.get_rng_state()}}
    save_checkpoint(tmp_path / "in_place", 2, tensors, {"digest": "x", "rows": rows}, keep=1)
    writer = CheckpointWriter("[colocated]")
    writer.save(tmp_path / "behind", 2, tensors, {"digest": "x", "rows": rows}, keep=1)
    kept = weights.clone()
    weights.add_(1.0)  # the next step, while the write may be in flight
    rows.append({"step": 2})
    writer.wait()
    for name in ("policy.safetensors", "rng.safetensors", "state.json"):
        assert (tmp_path / "behind" / "step-000002" / name).read_bytes() == \
            (tmp_path / "in_place" / "step-000002" / name).read_bytes(), name
    got, state = load_checkpoint(latest_checkpoint(tmp_path / "behind", "x"))
    assert torch.equal(got["policy"]["a.weight"], kept) and state["rows"] == [{"step": 1}]
    said = capsys.readouterr().out
    assert said.startswith("[colocated] checkpoint step-000002 written: 13.2 kB in ")  # 64 x 32 fp32 and an RNG state
    assert said.count("\n") == 1
    writer.save(tmp_path / "behind", 4, tensors, {"digest": "x", "rows": rows}, keep=1)
    writer.wait()
    assert [p.name for p in list_checkpoints(tmp_path / "behind")] == ["step-000004"]

    from ratchet.rl import checkpoint

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    writer.save(tmp_path / "behind", 6, tensors, {"digest": "x"}, keep=1)
    with pytest.raises(OSError, match="No space left"):
        writer.close()
    assert "step-000006" not in capsys.readouterr().out  # a failed write is not said written


def test_optimizer_and_rng_round_trip_bit_exactly():
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))  # noqa: E731
    a = make()
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2, foreach=False)
    x = torch.randn(16, 4)
    for _ in range(3):
        opt_a.zero_grad()
        a(x).pow(2).sum().backward()
        opt_a.step()
    b = make()
    b.load_state_dict(a.state_dict())
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, foreach=False)
    load_optimizer(opt_b, b, {k: v.clone() for k, v in optimizer_tensors(opt_a, a).items()})
    rng = rng_tensors()
    noise_a = torch.randn(3)
    load_rng(rng)
    assert torch.equal(torch.randn(3), noise_a)
    for model, opt in ((a, opt_a), (b, opt_b)):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


# ---------------------------------------------------------------------------- resuming
def _cli(mode: str, profile: Path, results: Path, *overrides: str) -> list[str]:
    # overrides before --config: argparse does not take positionals after an option's value
    return [sys.executable, "-m", "ratchet", f"train_{mode}", f"results_dir={results}", *overrides,
            "--config", str(profile)]


# For the killed run: each checkpoint written behind the run takes `seconds` longer, as a GPU
# run's 7 GB do against its sub-second steps (the tiny model's take no time at all), and its
# snapshot (the host copy of those 7 GB, then the state as text) a quarter of that, while the
# split engine on a thread goes on drawing the next batch.
SLOW_WRITES = """
import time
import ratchet.rl.checkpoint as checkpoint
_write, _snapshot = checkpoint._write, checkpoint._snapshot
def _slow_write(*args, **kwargs):
    time.sleep({seconds})
    return _write(*args, **kwargs)
def _slow_snapshot(*args, **kwargs):
    time.sleep({seconds} / 4)
    return _snapshot(*args, **kwargs)
checkpoint._write, checkpoint._snapshot = _slow_write, _slow_snapshot
"""


def sigkill_and_resume(tmp_path: Path, cfg: dict, profile: Path, mode: str, overrides: tuple, steps: int,
                       every: int, alongside: bool = False, slow_writes_s: float = 0.0) -> None:
    """`python -m ratchet train_<mode>`, killed with SIGKILL at a random step and rerun, ends
    with the weights, model file and trace of an uninterrupted run (prepared under `results`);
    `alongside`: the uninterrupted run goes on at the same time (the CPU's second core);
    `slow_writes_s`: the killed run's checkpoint writes take that much longer, their snapshots
    a quarter of that (sitecustomize)."""
    from ratchet.paths import RunPaths

    env = {**os.environ, "RATCHET_TRACKING": "off"}
    killed_env = dict(env)
    if slow_writes_s > 0:
        hook = tmp_path / "slow_writes"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(SLOW_WRITES.format(seconds=slow_writes_s))
        killed_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), str(ROOT), env.get("PYTHONPATH")]))
    paths = RunPaths.from_config(cfg)
    results = Path(cfg["results_dir"])
    # the uninterrupted run, elsewhere (a copy of the prepared model and data)
    other = tmp_path / "other"
    shutil.copytree(results, other, symlinks=True)
    with open(tmp_path / "uninterrupted.log", "w") as log:  # a file: a pipe left unread could fill
        uninterrupted = subprocess.Popen(_cli(mode, profile, other, *overrides), env=env, stdout=log,
                                         stderr=subprocess.STDOUT)
    if not alongside:
        _finished(uninterrupted, tmp_path / "uninterrupted.log")

    # a random step with steps left after it, once a checkpoint is written: the files are written
    # behind the steps (seconds at 0.5B on a GPU, where a step is under one), so a kill before
    # the first "written" line would resume from nothing
    kill_after = random.Random(os.getpid()).randrange(every + 1, steps - 1)
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen(_cli(mode, profile, results, *overrides), env=killed_env, stdout=subprocess.PIPE,
                            stderr=log, text=True)
    written, killed_at = False, None
    for line in proc.stdout:  # kill mid-run, at the first step from `kill_after` on after a checkpoint
        written = written or line.startswith(f"[{mode}] checkpoint step-")
        step = re.match(rf"\[{mode}\] step\s+(\d+)", line)
        if written and step and int(step.group(1)) >= kill_after:
            os.kill(proc.pid, signal.SIGKILL)
            killed_at = int(step.group(1))
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not paths.train_summary(mode).exists()
    assert list_checkpoints(paths.checkpoints(mode))

    try:  # the resumed run against the uninterrupted one
        done = subprocess.run(_cli(mode, profile, results, *overrides), env=env, check=True,
                              capture_output=True, text=True, timeout=1200)
        assert "resumed from" in done.stdout
        _finished(uninterrupted, tmp_path / "uninterrupted.log")
        other_dir = other / cfg["run_name"] / "train" / mode
        reference = json.loads((other_dir / "summary.json").read_text())
        resumed = json.loads(paths.train_summary(mode).read_text())
        resumed_trace = pd.read_parquet(paths.train_trace(mode))
        reference_trace = pd.read_parquet(other_dir / "trace.parquet")
        # where the runs part, said in the message: a GPU run's output is seldom kept whole
        where = (f"killed after the line of step {killed_at}; {_resumed_line(done.stdout)}; "
                 f"{trace_divergence(resumed_trace, reference_trace)}; {_parity_lines(done.stdout)}")
        assert resumed["weights_sha256"] == reference["weights_sha256"], where
        assert resumed["model_sha256"] == reference["model_sha256"], where
        pd.testing.assert_frame_equal(resumed_trace, reference_trace)
        assert len(pd.read_parquet(paths.train_metrics(mode))) == steps
    finally:  # a GPU run's are 8 GB each, and pytest keeps the last three runs' temporary folders
        if uninterrupted.poll() is None:
            uninterrupted.kill()
            uninterrupted.wait()
        for run in (results, other):
            shutil.rmtree(run / cfg["run_name"] / "train" / mode / "checkpoints", ignore_errors=True)


def _resumed_line(stdout: str) -> str:
    found = re.search(r"resumed from \S+ at step \d+", stdout)
    return found.group(0) if found else "no 'resumed from' line"


def _parity_lines(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if "parity 0" in line]
    return "; ".join(lines[:3]) if lines else "no weights-parity failure printed"


def _finished(proc: subprocess.Popen, log: Path) -> None:
    assert proc.wait(timeout=1200) == 0, log.read_text()[-3000:]


def test_trace_divergence_names_the_first_step_and_side_that_differ():
    reference = pd.DataFrame({"step": [0, 1, 2], "tokens": ["a", "b", "c"], "logprobs": ["x", "y", "z"],
                              "loss": ["l0", "l1", "l2"], "weights": ["", "w1", ""]})
    assert trace_divergence(reference.copy(), reference) == "the traces agree on every step"
    trainer_side = reference.copy()
    trainer_side.loc[2, "weights"], trainer_side.loc[1, "loss"] = "other", "other"
    assert trace_divergence(trainer_side, reference) == "the traces part at step 1: loss"
    engine_side = reference.copy()
    engine_side.loc[1, ["tokens", "logprobs"]] = "other"
    assert trace_divergence(engine_side, reference) == "the traces part at step 1: tokens, logprobs"
    assert "lengths differ" in trace_divergence(reference.iloc[:2], reference)


@pytest.mark.slow
@pytest.mark.parametrize("mode, engine_in", [("colocated", "auto"), ("split", "process"), ("split", "thread")])
def test_sigkilled_training_resumes_to_the_same_weights(tmp_path, prepare, mode, engine_in):
    """Both modes on the CPU; split with its engine in a process of its own (the CPU's default)
    and on a thread, as on one GPU."""
    steps, every = 10, 2
    overrides = (f"train.steps={steps}", f"train.checkpoint_every={every}", "train.eval_every=0",
                 "train.problems_per_step=8", f"train.split.engine_in={engine_in}")
    cfg = prepare(tmp_path / "results", *overrides)
    # the writes slower than the steps, as on a GPU: the kill must wait for a whole checkpoint
    sigkill_and_resume(tmp_path, cfg, ROOT / "config" / "config.yaml", mode, overrides, steps, every,
                       alongside=True, slow_writes_s=1.0)


REAL_MODEL = ROOT / ".cache" / "real" / "qwen2.5-coder-0.5b-instruct.gguf"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["colocated", "split"])
def test_sigkilled_gpu_training_of_the_real_model_resumes_to_the_same_weights(tmp_path, mode):
    """The local profile on the GPU (the real model, bf16 trainer arithmetic, fused AdamW, the
    split engine on a thread), killed mid-run and rerun: the same weights as a run never killed."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not (REAL_MODEL.is_file() and GSM8K.is_file()):
        pytest.skip("needs the real model (.cache/real) and GSM8K (../shared/data/gsm8k)")
    from ratchet.stages import run_stage

    steps, every = 8, 2
    overrides = (f"train.steps={steps}", f"train.checkpoint_every={every}", "train.eval_every=0",
                 "train.compute_dtype=bf16", "train.keep_checkpoints=1")
    profile = ROOT / "config" / "local.yaml"
    os.environ["RATCHET_TRACKING"] = "off"
    cfg = config_mod.load(profile, [f"results_dir={tmp_path / 'results'}", *overrides])
    for stage in ("download_model", "download_data", "convert_weights", "build_engine"):
        run_stage(stage, cfg)
    sigkill_and_resume(tmp_path, cfg, profile, mode, overrides, steps, every)


@pytest.mark.slow
def test_split_resumes_from_an_older_checkpoint_bit_exactly(tmp_path, prepare):
    """The split loop restarted from the checkpoint of step 2 (trainer state, the batch the
    engine had already generated, the engine's weights and unfinished rollouts) replays the
    rest of the run exactly."""
    from ratchet.rl.split import run_split
    from ratchet.stages.train import make_job

    cfg = prepare(tmp_path / "results")
    job = make_job(cfg, "split", out_dir=tmp_path / "split", steps=5, checkpoint_every=2, problems_per_step=8,
                   keep_checkpoints=5, eval_every=0, extra_groups=4, max_new_tokens=12)
    full = run_split(job)
    full_trace = pd.read_parquet(tmp_path / "split" / "trace.parquet")
    ckpts = list_checkpoints(job.checkpoint_dir)
    assert [p.name for p in ckpts] == ["step-000002", "step-000004", "step-000005"]
    state = read_state(ckpts[0])
    assert state["pending"]["step"] == 2 and state["engine_version"] == 1  # one step ahead
    assert any(r["finish_reason"] is None for g in state["rollouts"]["in_flight"] for r in g["requests"])
    for p in ckpts[1:]:
        shutil.rmtree(p)
    for name in ("summary.json", "trace.parquet", "metrics.parquet"):
        (tmp_path / "split" / name).unlink()
    resumed = run_split(job)
    assert resumed["weights_sha256"] == full["weights_sha256"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "split" / "trace.parquet"), full_trace)


def test_a_split_checkpoint_holds_the_rollouts_of_its_batch_however_late_it_is_taken(tmp_path, prepare,
                                                                                        monkeypatch):
    """The split engine on a thread draws the next batch while the trainer checkpoints the one it
    took: a snapshot taken late (on a GPU, after seconds of copying 7 GB) still holds the
    unfinished answers as they were at that batch. It held the engine's live lists, grown
    since, and the GPU run resumed by a prefill of tokens that the uninterrupted run had
    decoded: other bits from the batch after the checkpoint (the twentieth session)."""
    import time

    import ratchet.rl.checkpoint as checkpoint
    from ratchet.rl.split import run_split
    from ratchet.stages.train import make_job

    cfg = prepare(tmp_path / "results")
    snapshot, states = checkpoint._snapshot, []
    for delay_s in (0.0, 0.5):
        def late(*args, delay_s=delay_s, **kwargs):
            time.sleep(delay_s)  # the engine thread runs meanwhile
            return snapshot(*args, **kwargs)

        monkeypatch.setattr(checkpoint, "_snapshot", late)
        job = make_job(cfg, "split", out_dir=tmp_path / f"late{delay_s}", steps=4, checkpoint_every=2,
                       problems_per_step=8, keep_checkpoints=5, eval_every=0, engine_in="thread")
        run_split(job)
        states.append(read_state(list_checkpoints(job.checkpoint_dir)[0])["rollouts"])
    assert any(r["finish_reason"] is None for g in states[0]["in_flight"] for r in g["requests"])
    assert states[1] == states[0]


def test_a_checkpoints_engine_weights_go_back_in_the_layouts_order(tmp_path):
    """safetensors reads tensors back by name; the split trainer's first broadcast on resuming
    (sync.flatten, then the layout's views) needs them in the layout's order."""
    from random_model import random_weights

    from ratchet.model.config import ModelConfig
    from ratchet.model.layout import expected_shapes
    from ratchet.rl.split import in_layout_order
    from ratchet.rl.sync import flatten, unflatten

    cfg = ModelConfig(arch="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=11,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, tie_word_embeddings=False,
                      rope_theta=1e4, eos_token_ids=[])
    weights = {k: torch.from_numpy(v).half() for k, v in random_weights(cfg, 0, "fp16").items()}
    path = save_checkpoint(tmp_path, 1, {"engine": weights}, {})
    loaded = load_checkpoint(path)[0]["engine"]
    assert list(loaded) != list(expected_shapes(cfg))  # by name: layers.10 before layers.2, w_down before wqkv
    ordered = in_layout_order(loaded, cfg)
    assert list(ordered) == list(expected_shapes(cfg))
    for name, view in unflatten(flatten(ordered), cfg).items():
        assert torch.equal(view, weights[name].float()), name
