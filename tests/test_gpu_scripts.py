"""The GPU machine's scripts (dev/gpu/): every one parses, and plan.sh runs a plan's steps one
after another, each with its own $OUT, records a failing step and goes on, and brings back
what its #keep lines name."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[1] / "dev" / "gpu"


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.sh")))
def test_every_gpu_script_parses(script):
    assert subprocess.run(["bash", "-n", str(GPU / script)], capture_output=True, check=False).returncode == 0


@pytest.mark.parametrize("plan", sorted(p.name for p in (GPU / "plans").glob("*.txt")))
def test_every_plan_step_parses(plan):
    """A plan's steps run one a line under `bash -o pipefail -c`: a quoting slip found on the
    GPU machine costs a lease, found here it costs nothing."""
    lines = (GPU / "plans" / plan).read_text().splitlines()
    steps = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert steps, plan
    for step in steps:
        out = subprocess.run(["bash", "-n", "-c", step], capture_output=True, text=True, check=False)
        assert out.returncode == 0, f"{plan}: {step[:120]}: {out.stderr}"


def test_a_plan_runs_its_steps_in_order_past_a_failure_and_keeps_what_it_names(tmp_path):
    repo = tmp_path / "repo"
    (repo / "dev" / "gpu").mkdir(parents=True)
    for name in ("plan.sh", "env.sh", "detached.sh"):  # a copy without .whl/: env.sh installs nothing
        shutil.copy(GPU / name, repo / "dev" / "gpu" / name)
    (repo / "results").mkdir()
    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    (state / "plan.txt").write_text("# a comment\n#keep results/*.txt\n\necho one > \"$OUT/a.txt\"\nexit 3\n"
                                    "(echo piped; exit 4) | tail -n 1\n"  # the step's rc is its failing command's, not tail's
                                    "echo kept > results/r.txt && echo two > \"$OUT/b.txt\"\n")
    env = {"PATH": "/usr/bin:/bin", "PLAN_STATE": str(state), "HOME": str(tmp_path)}
    run = lambda *args, **kw: subprocess.run(["bash", "dev/gpu/plan.sh", *args], cwd=repo, capture_output=True,
                                             text=True, check=False, env={**env, **kw})
    assert run("run").returncode == 0
    log = (state / "plan.log").read_text().splitlines()
    assert [line.split(": ")[0].split(" start")[0] for line in log if " start " in line] == \
        ["[plan] step 1/4", "[plan] step 2/4", "[plan] step 3/4", "[plan] step 4/4"]
    assert "[plan] step 2/4 rc 3" in "\n".join(log) and log[-1].startswith("[plan] done")
    assert "[plan] step 3/4 rc 4" in "\n".join(log) and (state / "step3.log").read_text() == "piped\n"
    assert (state / "out" / "step1" / "a.txt").read_text() == "one\n"
    assert (state / "out" / "step4" / "b.txt").read_text() == "two\n"
    out.mkdir()
    polled = run("collect", OUT=str(out))
    assert polled.returncode == 0, polled.stderr
    with tarfile.open(out / "plan.tgz") as plan:  # one archive: the device returns a limited number of files
        names = plan.getnames()
        assert plan.extractfile("step4/b.txt").read() == b"two\n" and "./plan.log" in names, names
    with tarfile.open(out / "keep.tgz") as kept:  # one file: the device returns nothing deeper than two folders
        assert kept.extractfile("results/r.txt").read() == b"kept\n"


def test_a_started_plan_runs_in_its_own_copy_of_the_checkout(tmp_path):
    """The device rewrites the checkout at every call: the steps run in a copy, and what they
    write lands there, so neither a refresh nor a local edit reaches a running plan."""
    repo = tmp_path / "repo"
    (repo / "dev" / "gpu").mkdir(parents=True)
    for name in ("plan.sh", "env.sh", "detached.sh"):
        shutil.copy(GPU / name, repo / "dev" / "gpu" / name)
    (repo / "dev" / "gpu" / "assemble-model.sh").write_text("exit 0\n")  # no model to join here
    (repo / "code.txt").write_text("as started\n")
    plan, state = tmp_path / "plan.txt", tmp_path / "state"
    plan.write_text('sleep 1 && cp code.txt "$OUT/seen.txt" && mkdir -p results && echo r > results/r.txt\n')
    env = {"PATH": "/usr/bin:/bin", "PLAN_STATE": str(state), "HOME": str(tmp_path), "START_WAIT_S": "0"}
    started = subprocess.run(["bash", "dev/gpu/plan.sh", "start", str(plan)], cwd=repo, capture_output=True,
                             text=True, check=False, env=env)
    assert started.returncode == 0, started.stderr
    (repo / "code.txt").write_text("edited meanwhile\n")  # a refresh of the checkout mid-step
    for _ in range(100):
        if (state / "rc").is_file():
            break
        time.sleep(0.1)
    assert (state / "rc").is_file(), (state / "plan.log").read_text()
    assert (state / "out" / "step1" / "seen.txt").read_text() == "as started\n"
    assert (state / "repo" / "results" / "r.txt").is_file() and not (repo / "results").exists()


def test_a_poll_on_a_fresh_machine_says_the_run_is_lost_at_once(tmp_path):
    """The machine goes back 30 s after a call, and a detached run with it: a poll that finds
    no plan state says so and returns, instead of waiting out WAIT_S on an empty machine."""
    repo = tmp_path / "repo"
    (repo / "dev" / "gpu").mkdir(parents=True)
    for name in ("plan.sh", "env.sh", "detached.sh"):
        shutil.copy(GPU / name, repo / "dev" / "gpu" / name)
    env = {"PATH": "/usr/bin:/bin", "PLAN_STATE": str(tmp_path / "gone"), "HOME": str(tmp_path), "WAIT_S": "60"}
    start = time.monotonic()
    polled = subprocess.run(["bash", "dev/gpu/plan.sh", "wait"], cwd=repo, capture_output=True, text=True,
                            check=False, env=env)
    assert polled.returncode == 3 and "a fresh machine, the run is lost" in polled.stdout
    assert time.monotonic() - start < 30


def test_the_next_runs_statements_come_from_the_peaks_the_logs_end_with(tmp_path):
    """dev/stated_from_peaks.py: each stage's largest peak over its jobs' logs, with the
    margin, rounded up; a log without a peak line (a CPU stage) states nothing."""
    import sys

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ablate_fix.log").write_text("[ablate_fix] step 1\n[ablate_fix] peak GPU memory 22.7 GiB (this process)\n"
                                         "[ablate_fix] by allocator: torch allocated 18.3 GiB\n")
    (logs / "ablate_learning_run-fp16-none.log").write_text(
        "[ablate_learning_run-fp16-none] peak GPU memory 30.0 GiB (this process, as nvidia-smi sees it)\n")
    (logs / "ablate_learning_run-bf16-none.log").write_text(
        "[ablate_learning_run-bf16-none] peak GPU memory 31.5 GiB (this process, as nvidia-smi sees it)\n")
    (logs / "download_data.log").write_text("[download_data] done in 8.0 s\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "dev.stated_from_peaks", *map(str, a)],  # noqa: E731
                                    cwd=GPU.parents[1], capture_output=True, text=True, check=False)
    assert run(logs).stdout.split() == ["gpu_memory_gib.ablate_fix=26",  # 22.7 * 1.08 + 1 = 25.5
                                        "gpu_memory_gib.ablate_learning_run=36"]  # the larger job's
    assert run(logs, "--margin", "0", "--extra-gib", "0").stdout.split() == \
        ["gpu_memory_gib.ablate_fix=23", "gpu_memory_gib.ablate_learning_run=32"]
    assert run(logs, "--margin", "0", "--extra-gib", "0", "--per-job").stdout.split() == \
        ["gpu_memory_gib.ablate_fix=23", "gpu_memory_gib.ablate_learning_run=32",
         "gpu_memory_gib.ablate_learning_run-bf16-none=32", "gpu_memory_gib.ablate_learning_run-fp16-none=30"]
    missing = run(tmp_path / "nowhere")
    assert missing.returncode == 2 and "no folder" in missing.stderr
