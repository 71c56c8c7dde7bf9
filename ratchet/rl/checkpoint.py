"""Checkpoints: tensors in safetensors, everything else in JSON, no pickle; written to a
temporary directory and renamed, so a run killed at any moment resumes from the newest whole
one, and never from one written under other settings."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STATE_FILE = "state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


# <root>/step-000010/: policy.safetensors (fp32 masters), optimizer.safetensors (AdamW state),
# rng.safetensors, engine.safetensors (split: the weights the engine process holds) and
# state.json (step, settings digest, data positions, unfinished rollouts, metrics so far)
def save_checkpoint(root: str | Path, step: int, tensors: dict[str, dict[str, torch.Tensor]],
                    state: dict, keep: int = 2) -> Path:
    """Write `<root>/step-<step>/` with one safetensors file per entry of `tensors`."""
    return _write(Path(root), step, *_snapshot(step, tensors, state), keep)


def _snapshot(step: int, tensors: dict[str, dict[str, torch.Tensor]], state: dict) -> tuple[dict, str]:
    """(host copies of the tensors, the state as text): what a checkpoint of this moment holds,
    whatever the run changes after."""
    host = {name: {k: v.detach().to("cpu", copy=True).contiguous() for k, v in group.items()}
            for name, group in tensors.items()}
    return host, json.dumps({**state, "step": step}) + "\n"


def _write(root: Path, step: int, host: dict[str, dict[str, torch.Tensor]], state_text: str, keep: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for name, group in host.items():
        save_file(group, str(tmp / f"{name}.safetensors"))
    (tmp / STATE_FILE).write_text(state_text)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(root, final, step, json.loads(state_text).get("digest"), keep)
    return final


def _prune(root: Path, final: Path, step: int, digest: str | None, keep: int) -> None:
    """Keep the `keep` newest checkpoints of this run (`final` among them; all where keep <= 0)
    and remove those no resume of it can use: written under other settings, or past `step` (an
    earlier run's; this one writes its steps in order). Sorting them all by step, as before,
    removed a run's own new checkpoints while a stale run's later steps were there."""
    own, stale = [], []
    for path in list_checkpoints(root):
        if path != final:
            ours = int(_STEP_DIR.match(path.name).group(1)) < step and read_state(path).get("digest") == digest
            (own if ours else stale).append(path)
    gone = stale + (own[:len(own) - (keep - 1)] if keep > 0 else [])
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        print(f"[checkpoint] removed {len(stale)} checkpoint(s) of an earlier run under {root} "
              f"(other settings, or steps past {step}): {', '.join(p.name for p in stale)}\n", end="", flush=True)


class CheckpointWriter:
    """`save_checkpoint` behind the run: the tensors are copied to host memory and the state
    written to text at once (the run goes on changing both), the files by a thread while the
    next steps train (at 0.5B a checkpoint is ~7 GB, seconds of disk). One write in flight at
    a time; `wait()` (before the next, and before the run's outputs) raises what it raised. A
    run killed mid-write leaves a temporary directory, which resuming removes, as before. Each
    finished write is printed under `label`: until that line a kill resumes from the one before."""

    def __init__(self, label: str = "[train]"):
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratchet-checkpoint")
        self._pending = None
        self.label = label

    def save(self, root: str | Path, step: int, tensors: dict[str, dict[str, torch.Tensor]], state: dict,
             keep: int = 2) -> None:
        self.wait()
        self._pending = self._pool.submit(self._write_and_say, Path(root), step, *_snapshot(step, tensors, state),
                                          keep)

    def _write_and_say(self, root: Path, step: int, host: dict, state_text: str, keep: int) -> Path:
        start = time.perf_counter()
        final = _write(root, step, host, state_text, keep)
        size = sum(t.numel() * t.element_size() for group in host.values() for t in group.values())
        # one write call: the training thread prints its step lines at the same time
        print(f"{self.label} checkpoint {final.name} written: {_bytes(size)} in "
              f"{time.perf_counter() - start:.1f} s\n", end="", flush=True)
        return final

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown()


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.1f} kB"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Whole checkpoints, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str | Path, digest: str | None = None) -> Path | None:
    """The newest whole checkpoint written under settings `digest` (any if None)."""
    for path in reversed(list_checkpoints(root)):
        if digest is None or read_state(path).get("digest") == digest:
            return path
    return None


def read_state(path: str | Path) -> dict:
    return json.loads((Path(path) / STATE_FILE).read_text())


def load_checkpoint(path: str | Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict]:
    path = Path(path)
    tensors = {p.name.removesuffix(".safetensors"): load_file(str(p))
               for p in sorted(path.glob("*.safetensors"))}
    return tensors, read_state(path)


def clean_temporaries(root: str | Path) -> None:
    """Remove half-written checkpoints a killed run left behind."""
    root = Path(root)
    if root.is_dir():
        for p in root.glob(".step-*.tmp-*"):
            shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------- optimiser, RNG
def optimizer_tensors(optimizer: torch.optim.Optimizer, policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """AdamW's per-parameter state under the parameters' names."""
    out = {}
    for name, p in policy.named_parameters():
        for key, value in optimizer.state.get(p, {}).items():
            out[f"{name}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return out


def load_optimizer(optimizer: torch.optim.Optimizer, policy: torch.nn.Module,
                   tensors: dict[str, torch.Tensor]) -> None:
    fused = any(group.get("fused") for group in optimizer.param_groups)
    for name, p in policy.named_parameters():
        # moments on the parameter's device; AdamW keeps `step` on the CPU, fused AdamW with them
        state = {k.removeprefix(name + "."): v.clone().to(p.device) if fused or k.endswith("exp_avg") or
                 k.endswith("exp_avg_sq") else v.clone()
                 for k, v in tensors.items() if k.rsplit(".", 1)[0] == name}
        if state:
            optimizer.state[p] = state


def rng_tensors() -> dict[str, torch.Tensor]:
    return {"torch_cpu": torch.get_rng_state()}


def load_rng(tensors: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
