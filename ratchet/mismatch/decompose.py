"""The training-inference gap cut into its sources (PAIRS), each switched on alone, measured
on the same fresh tokens after each count of real GRPO updates, along the run that also
counts the visibility of every update and compares the remedies' gradients (gradient.py):
three studies of the same plain GRPO run, so one run of its fp32 updates serves them all."""

from __future__ import annotations

import contextlib
import dataclasses

import pandas as pd

from ratchet.gap import gap_metrics
from ratchet.gpu_memory import return_gpu_memory
from ratchet.mismatch.ablation import AblateSettings, Setup, Trajectory
from ratchet.mismatch.idle_engines import MeasuringEngines
from ratchet.mismatch.visibility import first_rows, update_rows
from ratchet.trainer.parking import parked_state

IDLE_LAP = "idle engines released and made again"  # its Laps phase
SOURCES = ("weight_rounding", "arithmetic", "engine_kernels", "total", "fixed", "exact")
# source -> (reference, against); a side is "engine" or (weight_dtype, compute_dtype), "E" = the engine's
PAIRS = {
    "weight_rounding": (("fp32", "fp32"), ("E", "fp32")),
    "arithmetic": (("E", "fp32"), ("E", "E")),
    "engine_kernels": ("engine", ("E", "E")),
    "total": ("engine", ("fp32", "fp32")),
    "fixed": ("engine", ("E", "fp32")),
    "exact": ("engine", "forced"),
}


def side_name(side, dtype: str) -> str:
    if side == "engine":
        return f"engine {dtype}"
    if side == "forced":
        return f"trainer {dtype} weights, engine {dtype} arithmetic (teacher forcing)"
    w, c = (dtype if s == "E" else s for s in side)
    return f"trainer {w} weights, {c} maths"


def measure_sources(policy, engine, prompts: list[list[int]], max_new_tokens: int, seed: int,
                    temperature: float = 1.0, eps: float = 0.2, exact_batch_size: int = 16) -> list[dict]:
    """Sync `engine` from the masters, sample, and measure every source on those tokens."""
    from ratchet.mismatch.compare import (
        engine_logprobs,
        exact_logprobs,
        sample,
        trainer_logprobs,
    )
    from ratchet.rl.sync import sync_weights

    dtype = engine.dtype
    sync_weights(engine, policy)
    reqs = sample(engine, prompts, max_new_tokens, seed, temperature)
    cache = {"engine": engine_logprobs(reqs)}

    def logprobs(side):
        key = side if isinstance(side, str) else tuple(dtype if s == "E" else s for s in side)
        if key not in cache:
            cache[key] = exact_logprobs(engine, reqs, temperature, exact_batch_size) if key == "forced" \
                else trainer_logprobs(policy, reqs, temperature, *key)
        return cache[key]

    rows = []
    for source in SOURCES:
        ref, other = PAIRS[source]
        m = gap_metrics(logprobs(ref), logprobs(other), eps=eps, prefix="")
        rows.append({"engine_dtype": dtype, "source": source,
                     "reference": side_name(ref, dtype), "against": side_name(other, dtype),
                     "abs_diff_mean": m["logprob_abs_diff_mean"],
                     "abs_diff_p99": m["logprob_abs_diff_p99"],
                     "abs_diff_max": m["logprob_abs_diff_max"],
                     "ratio_outside_share": m["ratio_outside_share"],
                     "kl_k3": m["kl_k3"], "num_tokens": int(m["num_tokens"])})
    return rows


def along_updates(setup: Setup, settings: AblateSettings, log=None, log_visibility=None,
                  visibility_updates: int | None = None,
                  measure_at: tuple[int, ...] | None = None,
                  backends: tuple[str, ...] | None = None,
                  gradient_at: tuple[int, ...] = (), log_gradient=None, laps=None,
                  gradient_dtypes: tuple[str, ...] | None = None, log_update=None, log_measured=None,
                  gradient_counts: dict | None = None,
                  release_idle_engines: bool | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(decomposition, visibility, gradient) along one plain GRPO run: every update up to
    `visibility_updates` is counted as it happens, the sources measured after each count in
    `measure_at` (defaults from `settings`; 0 and () for none) and the remedies' gradients
    after each count in `gradient_at` (gradient.py's rows; () for none) on the engine dtypes
    `gradient_dtypes` (None: the settings'), each reported to its `log`. `backends`: measure the same masters on each of these engines (e.g. the setup's and
    vLLM), rows tagged with a `backend` column; None: the setup's engine alone, untagged.
    The gradient's fresh batches come from each dtype's own engine (a Rollouts of its own
    seed, after a sync from the same masters), never the trajectory's. `laps` (runtime.Laps):
    where the time goes, by phase. `log_update(u)`: update u is done, its measurements to come;
    `log_measured(u)`: every measurement after update u is done (only where there were some),
    said before the last of their logs. `gradient_counts`: the gradients' losses and backwards
    (gradient.variant_gradients' counts). `release_idle_engines` (None: on a CUDA setup): each
    dtype's gradients run with the other engines, the trajectory's too, dropped and their
    memory returned (gpu_memory.return_gpu_memory), and the GRPO steps after them with the
    measuring engines dropped; each is made again when next used (idle_engines.py)."""
    from ratchet.mismatch.gradient import gradient_rows
    from ratchet.rl.runtime import Laps

    laps = Laps() if laps is None else laps

    if visibility_updates is None:
        visibility_updates = settings.visibility_updates
    measure_at = settings.updates if measure_at is None else tuple(measure_at)
    gradient_at = tuple(gradient_at)
    gradient_dtypes = settings.engine_dtypes if gradient_dtypes is None else tuple(gradient_dtypes)
    run_cfg = settings.grpo("none")  # the plain run; its arithmetic moves only the masters' path
    traj = Trajectory(setup, dataclasses.replace(
        run_cfg, compute_dtype=settings.updates_compute_dtype or run_cfg.compute_dtype))
    tagged = backends is not None
    # every use syncs from the masters: a CUDA engine starts on them, nothing rounded on the host
    engines = MeasuringEngines(lambda key: setup.engine(key[1], backend=key[0], masters=traj.policy))

    def release_own(*held):
        """The setup backend's engines dropped but `held`; another backend's (vLLM's) stays: one
        such engine a process, slow to make."""
        engines.release(keep=[k for k in engines.keys() if k[0] != setup.backend or k in held])

    for backend in (backends or (setup.backend,)) if measure_at else ():
        for dtype in settings.engine_dtypes:
            engines.add((backend, dtype))
    for dtype in gradient_dtypes if gradient_at else ():  # the setup's engine of each dtype
        engines.add((setup.backend, dtype))
    engines.make_all()  # as the run starts: "trainer and engines"
    if release_idle_engines is None:
        release_idle_engines = setup.backend == "cuda"
    decompose_rows, visibility_rows, gradient_rows_ = [], [], []
    laps("trainer and engines")
    for update in range(max((*measure_at, *gradient_at, visibility_updates)) + 1):
        counted = visibility_updates and update <= visibility_updates
        if traj.engine is None and traj.updates < update:  # released; steps to come sample from it
            # nor do the steps sample from a measuring engine: the one the last passes kept goes
            # too (held, it made the steps the rule's peak at 1.5B: docs/MEMORY-1.5B.md)
            release_own()
            return_gpu_memory()  # the passes' cache first, so the engine takes what they held
            traj.restore_engine()
            laps(IDLE_LAP)
        # the masters this update moves from, copied just before it and dropped once it is
        # counted: no copy is held through the sources and the gradients (7 GB at 1.5B each)
        before = traj.masters() if counted and update > 0 else None
        if before is not None:
            laps("visibility")
        traj.advance_to(update, settings.max_steps_per_update, laps)
        if log_update is not None:
            log_update(update)
        if counted:
            now = traj.policy.export_weights()  # the live masters: counted before anything moves them
            found = first_rows(now, settings.engine_dtypes) if update == 0 else \
                update_rows(update, traj.step, before, now, settings.engine_dtypes)
            del before, now
            visibility_rows += found
            if log_visibility is not None:
                log_visibility(update, found)
            laps("visibility")
        measured = update in measure_at or update in gradient_at
        # AdamW's moments (twice the masters) wait on the host while the measurements hold the GPU
        with parked_state(traj.optimizer) if measured else contextlib.nullcontext(0) as parked:
            if parked:  # (a CPU trainer's state stays where it is)
                laps("AdamW state parked on the host")
            if update in measure_at:
                if engines.released():
                    return_gpu_memory()
                    engines.make_all()
                    laps(IDLE_LAP)
                found = []
                for key in engines.keys():  # no name holds an engine past its use: a release frees it
                    found += [{"updates": update, "steps": traj.step, **({"backend": key[0]} if tagged else {}), **r}
                              for r in
                              measure_sources(traj.policy, engines[key], setup.measure_prompts,
                                              settings.max_new_tokens, settings.seed + 1,
                                              settings.temperature, settings.eps, settings.micro_batch_size)]
                decompose_rows += found
                if log_measured is not None and update not in gradient_at:
                    log_measured(update)  # before its log's progress line, which then counts it
                if log is not None:
                    log(update, found)
                laps("sources")
            if update in gradient_at:
                for dtype in gradient_dtypes:
                    if release_idle_engines:  # the passes sample from none; this dtype's engine scores
                        release_own((setup.backend, dtype))
                        traj.release_engine()
                        return_gpu_memory()
                        engines.make((setup.backend, dtype))
                        laps(IDLE_LAP)
                    found = gradient_rows(traj, engines[(setup.backend, dtype)], setup.task, settings, update, laps,
                                          gradient_counts)
                    gradient_rows_ += found
                    if log_measured is not None and dtype == gradient_dtypes[-1]:
                        log_measured(update)
                    if log_gradient is not None:
                        log_gradient(dtype, update, found)
        if parked:
            laps("AdamW state parked on the host")
    return pd.DataFrame(decompose_rows), pd.DataFrame(visibility_rows), pd.DataFrame(gradient_rows_)
