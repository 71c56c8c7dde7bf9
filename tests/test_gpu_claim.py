"""GPU claims on a machine of several GPUs: each job takes the least-held GPU and sees only it,
a finished (or killed) job's GPU is free again, a job that asks for two takes two, and with
one GPU or none, or turned off, nothing changes. A job that states the memory it needs waits
until the jobs on a GPU leave it that much. The GPUs are named through CUDA_VISIBLE_DEVICES
and their memory capped by RATCHET_GPU_MEMORY_GIB, or read from a stand-in nvidia-smi: no
GPU is touched."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from ratchet.config import ConfigError, validate
from ratchet.gpu_claim import OFF_ENV, claim_gpus, visible_gpus
from ratchet.gpu_memory import ProcessPeak, gpu_totals_gib
from ratchet.stages import gpu_memory_wanted, gpus_wanted

HOLD = ("import os, sys, time; from ratchet.gpu_claim import claim_gpus; "
        "print(claim_gpus(sys.argv[3], int(sys.argv[1]), float(sys.argv[2]), poll_s=0.05), "
        "os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True); time.sleep(120)")


def _machine(tmp_path, gpus: str, memory_gib: str | None = None):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "RATCHET_GPU_LOCKS": str(tmp_path / "locks")}
    env.pop(OFF_ENV, None)
    if memory_gib is not None:
        env["RATCHET_GPU_MEMORY_GIB"] = memory_gib
    jobs = []

    def start(count: int = 1, need_gib: float = 0, name: str = "job") -> subprocess.Popen:
        """A job that claims and holds; its first line is read by `line`."""
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(count), str(need_gib), name], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.lines = queue.Queue()  # read by a thread: a buffered pipe cannot be polled for lines
        threading.Thread(target=lambda: [proc.lines.put(x.strip()) for x in proc.stdout], daemon=True).start()
        jobs.append(proc)
        return proc

    return start, jobs


def line(proc: subprocess.Popen, timeout_s: float = 30) -> str | None:
    """The job's next line, or None if it says nothing within the timeout (it waits)."""
    try:
        return proc.lines.get(timeout=timeout_s)
    except queue.Empty:
        return None


@pytest.fixture
def machine(tmp_path):
    """Jobs on a machine of three GPUs, one claim folder; each job is left holding its claim."""
    start, jobs = _machine(tmp_path, "0,1,2")

    def started(count: int = 1) -> tuple[subprocess.Popen, str]:
        proc = start(count)
        line(proc)  # the claim's own line, then the job's
        return proc, line(proc).split()[-1]

    yield started
    for proc in jobs:
        proc.kill()
        proc.wait()


@pytest.fixture
def one_gpu(tmp_path):
    """Jobs on a machine of one GPU of 100 GiB."""
    start, jobs = _machine(tmp_path, "0", memory_gib="100")
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


def test_a_gpu_stage_grows_torchs_segments_unless_the_user_set_the_allocator(monkeypatch, tmp_path):
    from ratchet.gpu_memory import ALLOC_DEFAULT, ALLOC_ENV
    from ratchet.stages import claim_gpus_for

    monkeypatch.setenv("RATCHET_GPU_LOCKS", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv(ALLOC_ENV, raising=False)
    claim_gpus_for("download_data", validate({}))  # no GPU stage: the environment as it was
    assert ALLOC_ENV not in os.environ
    claim_gpus_for("ablate_fix_run", validate({}))
    assert os.environ[ALLOC_ENV] == ALLOC_DEFAULT
    monkeypatch.setenv(ALLOC_ENV, "")  # the user's, even empty, is kept
    claim_gpus_for("train_split", validate({}))
    assert os.environ[ALLOC_ENV] == ""


def test_a_training_claims_the_gpus_its_settings_ask_for():
    assert gpus_wanted("eval_baseline", validate({})) == 1
    assert gpus_wanted("train_split", validate({})) == 1  # engine_in auto: a thread on one GPU
    workers = validate({"train": {"num_workers": 2, "split": {"engine_in": "process"}}})
    assert gpus_wanted("train_colocated", workers) == 2 and gpus_wanted("train_split", workers) == 2
    assert gpus_wanted("verify", workers) == 2 and gpus_wanted("ablate_fix_run", workers) == 1


def test_a_job_waits_until_the_jobs_on_its_gpu_leave_it_the_memory_it_needs(one_gpu):
    first = one_gpu(need_gib=60, name="ablate_fix")
    assert "60 GiB reserved" in line(first)
    second = one_gpu(need_gib=30, name="train_split")
    assert "1 other jobs on GPU 0; 30 GiB reserved" in line(second)  # 90 of 100: it fits
    third = one_gpu(need_gib=50, name="verify")
    assert line(third) == "[verify] waiting for 50 GiB of GPU 0: 90 of 100 GiB held by ablate_fix 60, train_split 30"
    assert line(third, timeout_s=1.0) is None  # still waiting
    first.send_signal(signal.SIGKILL)  # a killed job's reservation goes with its flock
    first.wait()
    claimed = line(third)
    assert claimed.startswith("[verify] GPU 0 of 1 (1 other jobs on GPU 0; 50 GiB reserved; waited"), claimed
    assert line(third).endswith(" 0")  # one GPU: it keeps the CUDA_VISIBLE_DEVICES it had


def test_a_two_gpu_job_on_one_gpu_takes_it_and_still_waits(one_gpu):
    first = one_gpu(need_gib=80, name="ablate_fix")
    line(first)
    split = one_gpu(count=2, need_gib=36, name="train_split")  # engine_in process, one GPU
    assert line(split).startswith("[train_split] waiting for 36 GiB of GPU 0")
    first.kill()
    first.wait()
    assert line(split).startswith("[train_split] GPU 0 of 1 (0 other jobs on GPU 0; 36 GiB reserved")


def test_a_job_larger_than_its_gpu_runs_when_the_gpu_is_free(one_gpu):
    small = one_gpu(need_gib=10, name="eval_baseline")
    line(small)
    big = one_gpu(need_gib=120, name="ablate_decompose")
    assert line(big).startswith("[ablate_decompose] waiting for 120 GiB")
    small.kill()
    small.wait()
    assert "120 GiB reserved" in line(big)
    assert "more than GPU 0's 100 GiB: it runs with the GPU to itself" in line(big)


def test_memory_picks_the_gpu_where_a_job_fits(tmp_path):
    start, jobs = _machine(tmp_path, "0,1,2", memory_gib="100")
    try:
        for need in (90, 30, 30):  # one job on each GPU, in order
            line(start(need_gib=need))
        fits = start(need_gib=60)  # GPU 1 or 2 have room: the first of them
        line(fits)
        assert line(fits).split()[-1] == "1"
        last = start(need_gib=50)  # only GPU 2 has room, though it holds as many jobs as GPU 0
        line(last)
        assert line(last).split()[-1] == "2"
    finally:
        for proc in jobs:
            proc.kill()
            proc.wait()


def test_a_stage_needs_what_its_profile_says(tmp_path):
    cfg = validate({"gpu_memory_gib": {"default": 12, "ablate_fix_run": 67}})
    assert gpu_memory_wanted("ablate_fix_run", cfg) == 67 and gpu_memory_wanted("verify", cfg) == 12
    assert gpu_memory_wanted("convert_weights", cfg) == 0  # not a GPU stage: nothing to wait for
    assert gpu_memory_wanted("verify", validate({})) == 0
    with pytest.raises(ConfigError, match="ablate_fxi"):
        validate({"gpu_memory_gib": {"ablate_fxi": 67}})
    with pytest.raises(ConfigError, match="verify-again"):  # only a stage of several jobs has labels
        validate({"gpu_memory_gib": {"verify-again": 67}})


def test_gpus_their_totals_and_a_process_peak_come_from_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$1" in\n'
                   '  --query-gpu=*) echo "0, GPU-aa, 143771"; echo "1, GPU-bb, 81559" ;;\n'
                   '  --query-compute-apps=*) echo "$PPID, 2048"; echo "1, 99999" ;;\nesac\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("RATCHET_GPU_MEMORY_GIB", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus() == ["0", "1"]  # as nvidia-smi counts them
    totals = gpu_totals_gib(["GPU-bb", "0", "7"])
    assert totals == {"GPU-bb": pytest.approx(79.647, abs=1e-3), "0": pytest.approx(140.401, abs=1e-3)}
    peak = ProcessPeak(every_s=0.05)
    assert peak.stop() == 2.0 and peak.stop() == 2.0  # this process's line only; a second stop, the same
    monkeypatch.setenv("RATCHET_GPU_MEMORY_GIB", "40")
    assert gpu_totals_gib(["0", "1"]) == {"0": 40.0, "1": 40.0}
    monkeypatch.setenv("RATCHET_GPU_MEMORY_GIB", "lots")
    with pytest.raises(ValueError, match="RATCHET_GPU_MEMORY_GIB"):
        gpu_totals_gib(["0"])


def test_a_gpu_stage_says_the_peak_it_held_where_the_record_reads_it(tmp_path, monkeypatch, capsys, prepare):
    from dev.record import PEAK
    from ratchet.stages import run_stage

    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\necho "$PPID, 3072"\n')  # this process holds 3 GiB
    smi.chmod(0o755)
    cfg = prepare(tmp_path / "results", "eval.num_problems=4", "eval.max_new_tokens=8")
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run_stage("eval_baseline", cfg)
    assert PEAK.findall(capsys.readouterr().out) == [("eval_baseline", "3.0")]
    run_stage("download_data", cfg, force=True)  # not a GPU stage: nothing sampled
    assert not PEAK.findall(capsys.readouterr().out)


def test_a_gpu_stage_splits_its_memory_by_allocator_without_starting_cuda(monkeypatch):
    """torch's most allocated and reserved, CuPy's pool: asked only of allocators the process
    started, so a CPU run (torch imported, CUDA never started) reports nothing."""
    from types import SimpleNamespace

    from ratchet.gpu_memory import allocator_split

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_initialized():
        assert allocator_split() == {}
    gib = 2 ** 30
    fake_cuda = SimpleNamespace(is_initialized=lambda: True, max_memory_allocated=lambda: 30 * gib,
                                max_memory_reserved=lambda: 45 * gib)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=fake_cuda))
    pool = SimpleNamespace(total_bytes=lambda: 6 * gib)
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(get_default_memory_pool=lambda: pool))
    assert allocator_split() == {"torch_allocated_gib": 30.0, "torch_reserved_gib": 45.0, "cupy_pool_gib": 6.0}

    def no_cuda():
        raise RuntimeError("cudaErrorNoDevice")

    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(get_default_memory_pool=no_cuda))
    assert allocator_split() == {"torch_allocated_gib": 30.0, "torch_reserved_gib": 45.0}


def test_laps_say_which_phase_raised_each_allocators_high_water_mark():
    """A rule's peak alone does not say which phase sets it: each lap takes the rise of every
    allocator's high-water mark since the lap before (nothing off the GPU)."""
    from ratchet.rl.runtime import Laps

    assert Laps(highs=dict).rises_line() == ""
    marks = iter([{}, {"torch": 20.0}, {"torch": 20.0, "cupy pool": 4.0}, {"torch": 50.0, "cupy pool": 4.0},
                  {"torch": 50.0, "cupy pool": 5.0}, {"torch": 61.5, "cupy pool": 5.0}])
    laps = Laps(highs=lambda: next(marks))
    for name in ("trainer", "engines", "gradients", "sources", "gradients"):
        laps(name)
    assert laps.rises == {"torch": {"trainer": 20.0, "gradients": 41.5}, "cupy pool": {"engines": 4.0, "sources": 1.0}}
    assert laps.rises_line() == ("torch 61.5 GiB, from 0.0: gradients +41.5, trainer +20.0; "
                                 "cupy pool 5.0 GiB, from 0.0: engines +4.0, sources +1.0")
    started = Laps(highs=iter([{"torch": 8.0}, {"torch": 9.0}]).__next__)
    started("updates")
    assert started.rises_line() == "torch 9.0 GiB, from 8.0: updates +1.0"


def test_pinned_pages_are_faulted_by_a_power_of_two_threads_as_torch_requires():
    from ratchet.gpu_memory import ALLOC_DEFAULT, register_threads

    assert [register_threads(c) for c in (1, 2, 3, 7, 8, 16, 128)] == [1, 2, 2, 4, 8, 16, 16]
    options = dict(kv.split(":") for kv in ALLOC_DEFAULT.split(","))
    assert options["pinned_use_cuda_host_register"] == "True" and options["expandable_segments"] == "True"
    threads = int(options["pinned_num_register_threads"])
    assert threads & (threads - 1) == 0 and 1 <= threads <= 16
