"""Which GPU a stage runs on, on a machine with several. Each GPU stage claims the GPU its
fellow jobs hold least (a slot file locked with flock, released when the process ends,
however it ends) and sees only that one (CUDA_VISIBLE_DEVICES), so Snakemake's
`--resources gpu_jobs=N` spreads N jobs over the GPUs instead of stacking them on the first.
With one GPU or none nothing changes; RATCHET_GPU_CLAIM=0 turns it off."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

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
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, _ in enumerate(line for line in out.splitlines() if line.startswith("GPU "))]


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


def claim_gpus(label: str, count: int = 1) -> list[str] | None:
    """Claim the `count` least-held visible GPUs for this process and make them the only ones
    it sees; returns their ids, or None where there is nothing to choose (no more GPUs than
    asked for, or turned off)."""
    if os.environ.get(OFF_ENV) == "0" or _held:
        return None
    gpus = visible_gpus()
    if len(gpus) <= count:
        return None
    folder = Path(os.environ.get(LOCKS_ENV) or Path(tempfile.gettempdir()) / f"ratchet-gpus-{os.getuid()}")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "choose.lock", "a") as chooser:  # one claim at a time on this machine
        fcntl.flock(chooser, fcntl.LOCK_EX)
        held = {gpu: {p.name for p in _slots(folder, gpu) if _is_held(p)} for gpu in gpus}
        chosen = sorted(gpus, key=lambda g: (len(held[g]), gpus.index(g)))[:count]
        for gpu in chosen:
            slot = next(_slot(gpu, k) for k in range(len(held[gpu]) + 1) if _slot(gpu, k) not in held[gpu])
            f = open(folder / slot, "a")  # noqa: SIM115 (held open until the process ends)
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _held.append(f)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    others = ", ".join(f"{len(held[g])} other jobs on GPU {g}" for g in chosen)
    print(f"[{label}] GPU {','.join(chosen)} of {len(gpus)} ({others})", flush=True)
    return chosen
