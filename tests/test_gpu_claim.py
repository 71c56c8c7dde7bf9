"""GPU claims on a machine of several GPUs: each job takes the least-held GPU and sees only it,
a finished (or killed) job's GPU is free again, a job that asks for two takes two, and with
one GPU or none, or turned off, nothing changes. The GPUs are named through
CUDA_VISIBLE_DEVICES: no GPU is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ratchet.config import validate
from ratchet.gpu_claim import OFF_ENV, claim_gpus
from ratchet.stages import gpus_wanted

HOLD = ("import os, sys, time; from ratchet.gpu_claim import claim_gpus; "
        "print(claim_gpus('job', int(sys.argv[1])), os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True); "
        "time.sleep(120)")


@pytest.fixture
def machine(tmp_path):
    """Jobs on a machine of three GPUs, one claim folder; each job is left holding its claim."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2", "RATCHET_GPU_LOCKS": str(tmp_path / "locks")}
    env.pop(OFF_ENV, None)
    jobs = []

    def start(count: int = 1) -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(count)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        jobs.append(proc)
        lines = [proc.stdout.readline() for _ in range(2)]  # the claim's own line, then the job's
        return proc, lines[-1].split()[-1]

    yield start
    for proc in jobs:
        proc.kill()
        proc.wait()


def test_jobs_spread_over_the_gpus_and_a_killed_jobs_gpu_is_free_again(machine):
    _, gpu0 = machine()
    second, gpu1 = machine()
    _, gpu2 = machine()
    assert [gpu0, gpu1, gpu2] == ["0", "1", "2"]
    _, fourth = machine()
    assert fourth == "0"  # all held once: the first, shared
    second.send_signal(signal.SIGKILL)
    second.wait()
    _, fifth = machine()
    assert fifth == "1"  # a flock dies with its process, however it ends


def test_a_job_that_asks_for_two_gpus_takes_the_two_least_held(machine):
    _, gpu0 = machine()
    _, pair = machine(count=2)
    assert gpu0 == "0" and pair == "1,2"


def test_one_gpu_or_none_or_turned_off_changes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("RATCHET_GPU_LOCKS", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert claim_gpus("job") is None and os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert claim_gpus("job") is None and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv(OFF_ENV, "0")
    assert claim_gpus("job") is None and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv(OFF_ENV)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: no GPU to count
    assert claim_gpus("job") is None and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_training_claims_the_gpus_its_settings_ask_for():
    assert gpus_wanted("eval_baseline", validate({})) == 1
    assert gpus_wanted("train_split", validate({})) == 1  # engine_in auto: a thread on one GPU
    workers = validate({"train": {"num_workers": 2, "split": {"engine_in": "process"}}})
    assert gpus_wanted("train_colocated", workers) == 2 and gpus_wanted("train_split", workers) == 2
    assert gpus_wanted("verify", workers) == 2 and gpus_wanted("ablate_fix", workers) == 1
