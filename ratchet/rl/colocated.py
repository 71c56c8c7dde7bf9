"""Colocated GRPO (`ratchet train_colocated`): each worker generates with its own engine,
trains, and copies the masters into it, so only precision separates sampler and trainer.
Departs from the GRPO paper: no KL term, a token-mean loss, constant groups skipped."""

from __future__ import annotations

import time

from ratchet.rl.checkpoint import CheckpointWriter, load_checkpoint
from ratchet.rl.comm import Comm, free_port, init_process_group
from ratchet.rl.evaluate import Evaluator
from ratchet.rl.job import (
    Job,
    eval_rows,
    find_resume,
    load_start,
    relog,
    restore_trainer,
    trainer_tensors,
    write_outputs,
)
from ratchet.rl.rollout import Rollouts
from ratchet.rl.runtime import (
    Laps,
    Timer,
    Workers,
    configure_threads,
    set_determinism,
    worker_device,
)
from ratchet.rl.sync import sync_weights
from ratchet.rl.telemetry import SyncTelemetry, after_sync
from ratchet.rl.trace import rollout_digests, trace_row
from ratchet.rl.update import grpo_step


def run_colocated(job: Job, log=None) -> dict:
    """Train; returns the summary. Worker 0 runs here (and calls `log(metrics, step)`), the
    others as child processes."""
    world = job.grpo.num_workers
    if world == 1:
        return colocated_worker(job, 0, 1, None, log)
    port = free_port()
    workers = Workers(_spawned_worker, (job.to_json(), world, port), range(1, world))
    failed = True
    try:
        summary = colocated_worker(job, 0, world, port, log)
        failed = False
    finally:
        workers.close(failed)
    return summary


def colocated_worker(job: Job, rank: int, world: int, port: int | None, log=None) -> dict | None:
    cfg = job.grpo
    laps = Laps()
    device, backend, engine_gpu = worker_device(job.device, rank, world)
    if world > 1:
        init_process_group(rank, world, port, backend)
    comm = Comm(rank, world, device=device if backend == "nccl" else "cpu")
    set_determinism(cfg.seed)
    task = job.load_task()
    laps("task")
    model, policy, optimizer = load_start(job, device)
    configure_threads(model.cfg, world)
    laps("model and trainer")
    evaluator = Evaluator(task, cfg.eval_every, cfg.steps, job.eval_max_new_tokens) if rank == 0 else None
    # it holds the trainer's current weights, rounded: the exact forward scores with it; its
    # rows: a step's answers, or rank 0's eval problems
    engine_rows = max(cfg.groups_per_worker * cfg.group_size, eval_rows(task) if evaluator is not None else 0)
    engine = job.make_engine(model, batch_invariant=cfg.exact_forward, device=engine_gpu, rows=engine_rows)
    laps("engine")
    rollouts = Rollouts(task.prompts, cfg.group_size, cfg.max_new_tokens, cfg.temperature, cfg.seed,
                        cfg.groups_per_worker, extra_groups=0, max_staleness=cfg.max_staleness,
                        rank=rank, world=world)
    rows, trace, start = [], [], 0
    resume_from = find_resume(job)
    if resume_from is not None:
        tensors, state = load_checkpoint(resume_from)
        restore_trainer(policy, optimizer, tensors)
        rollouts.load_state_dict(state["rollouts"][rank])
        rows, trace, start = state["rows"], state["trace"], state["step"]
        sync_weights(engine, policy)
        print(f"[colocated] rank {rank}: resumed from {resume_from} at step {start}")
        relog(rows, log if rank == 0 else None)

    telemetry = SyncTelemetry(policy, cfg.engine_dtype)  # what each sync carries to the engine
    writer = CheckpointWriter("[colocated]") if job.checkpoints and rank == 0 else None  # writes behind the steps
    laps("telemetry")
    if rank == 0:
        print(f"[colocated] ready in {laps.line()}", flush=True)
    for step in range(start, cfg.steps):
        row, timer = {"step": step}, Timer()
        # ---------------------------------------------------------------- evaluate
        if evaluator is not None and evaluator.due(step):
            row.update(evaluator(engine))
        timer()
        step_start = time.perf_counter()  # the eval is not part of the step's time
        # ---------------------------------------------------------------- roll out
        groups, rollout_stats = rollouts.collect(engine, step, version=step)
        row["time/generate_s"] = timer()
        # ---------------------------------------------------------------- train
        metrics = grpo_step(policy, optimizer, groups, task, cfg, version=step, comm=comm, engine=engine,
                            engine_sampled=True)
        row["time/train_s"] = timer()
        # ---------------------------------------------------------------- sync weights
        sync_weights(engine, policy)
        row["time/sync_s"] = timer()
        row.update(after_sync(telemetry, policy, engine, f"[colocated] step {step}:"))
        # ---------------------------------------------------------------- log
        digests = rollout_digests(groups, comm)
        row.update(metrics)
        row.update({k: comm.max(v) for k, v in rollout_stats.items()})
        row["time/step_s"] = time.perf_counter() - step_start
        if rank == 0:
            trace.append(trace_row(step, digests, metrics["train/loss"], policy, cfg))
            rows.append(row)
            _print(step, row)
            if log is not None:
                log({k: v for k, v in row.items() if k != "step"}, step)
        # ---------------------------------------------------------------- checkpoint
        if job.checkpoints and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps):
            states = comm.gather_json(rollouts.state_dict())
            if rank == 0:
                writer.save(job.checkpoint_dir, step + 1, trainer_tensors(policy, optimizer),
                            {"digest": job.digest, "rollouts": states, "rows": rows, "trace": trace},
                            keep=cfg.keep_checkpoints)

    summary = None
    if rank == 0:
        if evaluator is not None and evaluator.due(cfg.steps):
            final_eval = evaluator(engine)
            rows.append({"step": cfg.steps, **final_eval})
            if log is not None:
                log(final_eval, cfg.steps)
        if writer is not None:
            writer.close()  # the last checkpoint written (beside the final eval)
        outputs = Timer()
        summary = write_outputs(job, policy, model.cfg, rows, trace,
                                {"mode": "colocated", "num_workers": world})
        print(f"[colocated] outputs written in {outputs():.1f} s", flush=True)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return summary


def _print(step: int, row: dict) -> None:
    parts = [f"step {step:4d}", f"reward {row['train/reward']:.3f}", f"loss {row['train/loss']:+.4f}",
             f"len {row['train/response_length_mean']:.1f}", f"{row['time/step_s']:.2f}s"]
    if "mismatch/logprob_abs_diff_mean" in row:
        parts.append(f"|dlogp| {row['mismatch/logprob_abs_diff_mean']:.1e}")
    if "eval/accuracy" in row:
        parts.append(f"eval {row['eval/accuracy']:.3f}")
    print("[colocated] " + "  ".join(parts), flush=True)


def _spawned_worker(rank: int, job_json: str, world: int, port: int) -> None:
    colocated_worker(Job.from_json(job_json), rank, world, port)
