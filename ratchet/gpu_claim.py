"""Which GPU a stage runs on, and when. Each GPU stage claims the GPU its fellow jobs hold least
(a slot file locked with flock, released when the process ends, however it ends) and sees only
that one (CUDA_VISIBLE_DEVICES), so Snakemake's `--resources gpu_jobs=N` spreads N jobs over
the GPUs instead of stacking them on the first. A stage that says what GPU memory it needs at
its peak (config `gpu_memory_gib`) writes it in its slot and waits, before it starts CUDA, until
the jobs already on a GPU leave it that much: three 0.5B GPU rules at a time once ran an H200
out of memory (two fp32 ablations of 64 GiB beside a verify). With one GPU and no need stated,
or none, nothing changes; RATCHET_GPU_CLAIM=0 turns it off."""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import time
from pathlib import Path

from ratchet.gpu_memory import gpu_totals_gib, smi_rows

OFF_ENV = "RATCHET_GPU_CLAIM"  # "0": leave CUDA_VISIBLE_DEVICES as it is
LOCKS_ENV = "RATCHET_GPU_LOCKS"  # the slot files' folder (default: one per user in the temp dir)
_held: list = []  # the claimed slot's open file: the claim lasts as long as the process


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them, else as nvidia-smi
    counts them: the choice must come before anything starts CUDA."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [x.strip() for x in listed.split(",") if x.strip()]
        return ids[:ids.index("-1")] if "-1" in ids else ids
    return [row[0] for row in smi_rows("--query-gpu=index,uuid")]


def _slot(gpu: str, k: int | str) -> str:
    """The name of a GPU's k-th slot file (a UUID or an index, made safe for a file name)."""
    return f"gpu-{re.sub(r'[^A-Za-z0-9_-]', '_', gpu)}.{k}.lock"


def _slots(folder: Path, gpu: str) -> list[Path]:
    return sorted(folder.glob(_slot(gpu, "*")))


def _is_held(path: Path) -> bool:
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _holders(folder: Path, gpu: str) -> list[tuple[str, str, float]]:
    """The held slots of a GPU: (slot file, the job's label, the GiB it reserved)."""
    found = []
    for path in _slots(folder, gpu):
        if _is_held(path):
            label, _, gib = path.read_text().rpartition(" ")
            try:
                found.append((path.name, label or "a job", float(gib)))
            except ValueError:  # a claim of before reservations, or one being written
                found.append((path.name, label or "a job", 0.0))
    return found


def claim_gpus(label: str, count: int = 1, need_gib: float = 0.0, poll_s: float = 2.0) -> list[str] | None:
    """Claim the `count` least-held visible GPUs for this process, each with `need_gib` of its
    memory free of other jobs' reservations (waiting for it), and make them the only ones it
    sees; returns their ids, or None where there is nothing to choose or wait for (no more
    GPUs than asked for and no need stated, or turned off). A job that needs more than a GPU
    has starts when that GPU holds no other job."""
    if os.environ.get(OFF_ENV) == "0" or _held:
        return None
    gpus = visible_gpus()
    if not gpus or (len(gpus) <= count and need_gib <= 0):
        return None
    choose = len(gpus) > count  # else it takes them all (say one GPU for a two-GPU split), but waits
    count = min(count, len(gpus))
    totals = gpu_totals_gib(gpus) if need_gib > 0 else {}
    if need_gib > 0 and not totals:
        print(f"[{label}] the GPUs' memory is unknown (no nvidia-smi): {need_gib:g} GiB not waited for", flush=True)
    folder = Path(os.environ.get(LOCKS_ENV) or Path(tempfile.gettempdir()) / f"ratchet-gpus-{os.getuid()}")
    folder.mkdir(parents=True, exist_ok=True)
    said, waited = 0.0, time.perf_counter()
    while True:
        with open(folder / "choose.lock", "a") as chooser:  # one claim at a time on this machine
            fcntl.flock(chooser, fcntl.LOCK_EX)
            held = {gpu: _holders(folder, gpu) for gpu in gpus}
            room = {g: totals.get(g, float("inf")) - sum(gib for *_, gib in held[g]) for g in gpus}
            fits = [g for g in gpus if need_gib <= room[g] or not held[g]]
            if len(fits) >= count:
                chosen = sorted(fits, key=lambda g: (len(held[g]), -room[g], gpus.index(g)))[:count]
                for gpu in chosen:
                    _take(folder, gpu, held[gpu], f"{label} {need_gib:g}")
                break
        if time.perf_counter() - said >= 60:  # say why it waits, then once a minute
            said = time.perf_counter()
            best = max(gpus, key=lambda g: room[g])
            jobs = ", ".join(f"{name} {gib:g}" for _, name, gib in held[best])
            print(f"[{label}] waiting for {need_gib:g} GiB of GPU {best}: {sum(gib for *_, gib in held[best]):g} "
                  f"of {totals.get(best, 0):.0f} GiB held by {jobs}", flush=True)
        time.sleep(poll_s)
    if choose:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    _say_claimed(label, chosen, len(gpus), held, need_gib, totals, time.perf_counter() - waited)
    return chosen


def _take(folder: Path, gpu: str, holders: list, reservation: str) -> None:
    """Hold a free slot file of `gpu` until this process ends, with its reservation in it."""
    names = {name for name, *_ in holders}
    slot = next(_slot(gpu, k) for k in range(len(names) + 1) if _slot(gpu, k) not in names)
    f = open(folder / slot, "a")  # noqa: SIM115 (held open until the process ends)
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.truncate(0)
    f.write(reservation)
    f.flush()
    _held.append(f)


def _say_claimed(label: str, chosen: list[str], visible: int, held: dict, need_gib: float, totals: dict,
                 waited_s: float) -> None:
    others = ", ".join(f"{len(held[g])} other jobs on GPU {g}" for g in chosen)
    print(f"[{label}] GPU {','.join(chosen)} of {visible} ({others}"
          + (f"; {need_gib:g} GiB reserved" if need_gib > 0 else "")
          + (f"; waited {waited_s:.0f} s" if waited_s >= 1 else "") + ")", flush=True)
    small = [g for g in chosen if need_gib > totals.get(g, float("inf"))]
    if small:  # it runs alone there, and may still not fit
        print(f"[{label}] needs {need_gib:g} GiB (config gpu_memory_gib), more than GPU {small[0]}'s "
              f"{totals[small[0]]:.0f} GiB: it runs with the GPU to itself and may run out of memory "
              "(smaller passes, then a smaller gpu_memory_gib)", flush=True)
