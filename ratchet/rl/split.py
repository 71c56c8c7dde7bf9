"""Split GRPO (`ratchet train_split`): the engine apart from the trainer (its own process, or a
thread of the trainer's on one GPU: ratchet/rl/link.py), one batch ahead, with partial
rollouts; tokens drawn by older weights take the engine's log-probs as "old", so the PPO ratio
is the importance ratio to the policy that drew them (the paper has no such lag)."""

from __future__ import annotations

import threading
import time

import torch

from ratchet.model.layout import expected_shapes
from ratchet.rl.checkpoint import CheckpointWriter, load_checkpoint
from ratchet.rl.comm import Comm, free_port, init_process_group
from ratchet.rl.evaluate import Evaluator
from ratchet.rl.job import (
    Job,
    TrainerEngine,
    eval_rows,
    find_resume,
    load_start,
    relog,
    restore_trainer,
    trainer_tensors,
    write_outputs,
)
from ratchet.rl.link import ENGINE, TRAINER, ProcessLink, ThreadLink
from ratchet.rl.rollout import Group, Rollouts
from ratchet.rl.runtime import Laps, Timer, Workers, configure_threads, set_determinism
from ratchet.rl.telemetry import SyncTelemetry, parity, torch_checksums
from ratchet.rl.trace import rollout_digests, trace_row
from ratchet.rl.update import grpo_step


def run_split(job: Job, log=None) -> dict:
    """Train; the trainer runs in this process (and calls `log(metrics, step)`), the engine
    on a thread of it (one GPU) or in a child process (two GPUs, or the CPU)."""
    if engine_on_thread(job):
        from ratchet.model.io import load_engine_model

        # one process: the task and the converted model are read once for both sides (at 1.5B
        # a read is 3.6 GB, its SHA-256 and a conversion to fp32)
        reading = Timer()
        loaded = job.load_task(), load_engine_model(job.model_dir)
        print(f"[split] task and model read once for the trainer and its engine thread in {reading():.1f} s",
              flush=True)
        trainer_end, engine_end = ThreadLink.pair(job.device)
        thread = threading.Thread(target=_engine_thread, args=(job, engine_end, loaded), name="ratchet-engine",
                                  daemon=True)
        thread.start()
        try:
            return trainer_loop(job, trainer_end, log, loaded)
        finally:
            trainer_end.close()
            thread.join()
    port = free_port()
    workers = Workers(_spawned_engine, (job.to_json(), port), range(ENGINE, ENGINE + 1), env=_engine_gpu(job))
    failed = True
    try:
        init_process_group(TRAINER, 2, port)  # gloo: the messages go through the CPU
        link = ProcessLink(TRAINER)
        summary = trainer_loop(job, link, log)
        link.close()
        failed = False
    finally:
        workers.close(failed)
    return summary


def engine_on_thread(job: Job) -> bool:
    """`train.split.engine_in`: auto puts the engine on a thread when it would share the
    trainer's one GPU (two processes there could only pass the weights through the host)."""
    where = job.grpo.engine_in
    if where == "auto":
        return job.device != "cpu" and torch.cuda.device_count() < 2
    return where == "thread"


def _engine_gpu(job: Job) -> dict[str, str]:
    """With two GPUs or more the engine process gets the second one (the trainer keeps the
    first); with one, both share it."""
    import os

    if job.device == "cpu" or torch.cuda.device_count() < 2:
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return {"CUDA_VISIBLE_DEVICES": ids[1]}


# ---------------------------------------------------------------------------- the trainer
# Messages, JSON over send/recv: trainer -> engine a start message (first batch, the engine's
# weights version, its rollout state on resume), then weight broadcasts; engine -> trainer one
# message per batch (its groups, its rollout state after it, the version that sampled it).
# A checkpoint is cut at the start of a trainer step, with the batch already generated for it
# and the engine's weights and rollout state as of that batch, so a resumed run replays exactly.
def trainer_loop(job: Job, link, log=None, loaded: tuple | None = None) -> dict:
    """The trainer's side; `loaded`: (Task, EngineModel) already read, else read here."""
    from ratchet.trainer.precision import torch_dtype

    cfg = job.grpo
    laps = Laps()
    set_determinism(cfg.seed)
    task, model = loaded if loaded is not None else (job.load_task(), None)
    laps("task")
    model, policy, optimizer = load_start(job, job.device, model)
    configure_threads(model.cfg, 2)
    laps("model and trainer")
    evaluator = Evaluator(task, cfg.eval_every, cfg.steps, job.eval_max_new_tokens)
    # its evals, and the exact forward's scoring (a step's answers at once)
    own_engine = TrainerEngine(job, rows=max(eval_rows(task), cfg.problems_per_step * cfg.group_size))
    engine_dtype = torch_dtype(cfg.engine_dtype)

    def engine_copy() -> dict[str, torch.Tensor] | None:
        """What the engine holds after a sync (only checkpoints need it). Kept where the
        masters are (a GPU copy costs a millisecond, a host copy a good part of a step) and
        moved to the host only when a checkpoint is written."""
        if not job.checkpoints:
            return None
        return {k: v.detach().to(engine_dtype, copy=True) for k, v in policy.export_weights().items()}

    rows, trace, start, pending = [], [], 0, None
    engine_version, rollout_state = 0, None
    resume_from = find_resume(job)
    if resume_from is not None:
        tensors, state = load_checkpoint(resume_from)
        restore_trainer(policy, optimizer, tensors)
        rows, trace, start, pending = state["rows"], state["trace"], state["step"], state["pending"]
        engine_version, rollout_state = state["engine_version"], state["rollouts"]
        engine_weights = in_layout_order(tensors["engine"], model.cfg)
        print(f"[split] resumed from {resume_from} at step {start}")
        relog(rows, log)
    else:
        engine_weights = {k: v.to("cpu", engine_dtype) for k, v in policy.export_weights().items()}
    # the engine restarts from the state the checkpoint recorded (or from scratch)
    weights_backend = "nccl" if _engine_gpu(job) else "gloo"
    link.send({"first_batch": start + (pending is not None), "version": engine_version,
               "rollouts": rollout_state, "weights_backend": weights_backend})
    link.open_weights(weights_backend)
    link.send_weights(policy, weights=engine_weights)
    laps("first weights to the engine")
    copies = {engine_version: engine_weights}  # weights version -> what the engine holds
    # weights version -> checksums of what the engine should hold (sync/weights_parity)
    expected = {engine_version: dict(zip(engine_weights, torch_checksums(engine_weights.values())))}
    telemetry = SyncTelemetry(policy, cfg.engine_dtype, held=engine_weights)
    writer = CheckpointWriter("[split]") if job.checkpoints else None  # writes behind the steps
    laps("telemetry")
    print(f"[split] trainer ready in {laps.line()}", flush=True)
    last_needed = cfg.steps - 1 - cfg.ahead  # the newest version the engine will ask for
    in_flight = None  # the weights broadcast still on its way (the engine takes it when it
    if engine_version < start <= last_needed:  # has finished the batch it is generating)
        in_flight = link.send_weights(policy, async_op=True)
        copies[start] = engine_copy()
        _, expected[start] = telemetry.measure(policy)

    for step in range(start, cfg.steps):
        row, timer = {"step": step}, Timer()
        # ---------------------------------------------------------------- evaluate
        if evaluator.due(step):
            row.update(evaluator(own_engine.synced(policy)))
        timer()
        step_start = time.perf_counter()  # the eval is not part of the step's time
        # ---------------------------------------------------------------- roll out (wait for it)
        message = pending if pending is not None else link.recv()
        pending = None
        row["time/wait_s"] = timer()
        engine_version, rollout_state = message["version"], message["rollouts"]
        copies = {v: w for v, w in copies.items() if v >= engine_version}
        if "weights_checksums" in message:  # what sampled this batch: the masters sent as its version?
            row["sync/weights_parity"], first = parity(expected[engine_version], message["weights_checksums"])
            if first is not None:
                print(f"[split] step {step}: sync/weights_parity 0: the engine's {first} is not the "
                      f"trainer's masters of version {engine_version}, rounded", flush=True)
        expected = {v: c for v, c in expected.items() if v >= engine_version}
        if job.checkpoints and step > start and step % cfg.checkpoint_every == 0:
            _checkpoint(writer, job, policy, optimizer, step, copies[engine_version], message, rows, trace)
        groups = [Group.from_dict(d) for d in message["groups"]]
        # ---------------------------------------------------------------- train
        scorer = own_engine.synced(policy) if cfg.exact_forward else None
        metrics = grpo_step(policy, optimizer, groups, task, cfg, version=step, engine=scorer)
        row["time/train_s"] = timer()
        # ---------------------------------------------------------------- sync weights
        if step + 1 <= last_needed:
            if in_flight is not None:
                in_flight.wait()
            in_flight = link.send_weights(policy, async_op=True)
            copies[step + 1] = engine_copy()
            shares, expected[step + 1] = telemetry.measure(policy)
            row.update(shares)
        row["time/sync_s"] = timer()
        # ---------------------------------------------------------------- log
        digests = rollout_digests(groups, Comm())
        row.update(metrics)
        row.update(message["stats"])
        row["time/generate_s"] = message["generate_s"]
        row["time/engine_receive_s"] = message["receive_s"]  # engine side of the weight sync, waits included
        row["rollout/weights_lag"] = float(step - message["version"])
        row["time/step_s"] = time.perf_counter() - step_start
        trace.append(trace_row(step, digests, metrics["train/loss"], policy, cfg))
        rows.append(row)
        _print(step, row)
        if log is not None:
            log({k: v for k, v in row.items() if k != "step"}, step)

    if in_flight is not None:
        in_flight.wait()
    if job.checkpoints:
        final = {"version": engine_version, "rollouts": rollout_state}
        _checkpoint(writer, job, policy, optimizer, cfg.steps, copies[engine_version], final, rows, trace,
                    pending=False)
    if evaluator.due(cfg.steps):
        final_eval = evaluator(own_engine.synced(policy))
        rows.append({"step": cfg.steps, **final_eval})
        if log is not None:
            log(final_eval, cfg.steps)
    if writer is not None:
        writer.close()  # the last checkpoint written (beside the final eval)
    where = "thread" if isinstance(link, ThreadLink) else "process"
    outputs = Timer()
    summary = write_outputs(job, policy, model.cfg, rows, trace,
                            {"mode": "split", "ahead": cfg.ahead, "extra_groups": cfg.extra_groups,
                             "engine_in": where})
    print(f"[split] outputs written in {outputs():.1f} s", flush=True)
    return summary


def in_layout_order(weights: dict[str, torch.Tensor], model_cfg) -> dict[str, torch.Tensor]:
    """A checkpoint's engine weights in the layout's order: safetensors gives them by name, and
    a broadcast (sync.flatten) lays them end to end in the order it is given."""
    return {name: weights[name] for name in expected_shapes(model_cfg)}


def _checkpoint(writer, job, policy, optimizer, step, engine_weights, message, rows, trace, pending=True):
    state = {"digest": job.digest, "rows": rows, "trace": trace,
             "pending": message if pending else None,
             "engine_version": message["version"], "rollouts": message["rollouts"]}
    writer.save(job.checkpoint_dir, step, {**trainer_tensors(policy, optimizer), "engine": engine_weights},
                state, keep=job.grpo.keep_checkpoints)


def _print(step: int, row: dict) -> None:
    parts = [f"step {step:4d}", f"reward {row['train/reward']:.3f}", f"loss {row['train/loss']:+.4f}",
             f"lag {row['rollout/weights_lag']:.0f}", f"stale {row['rollout/stale_token_share']:.2f}",
             f"gen {row['time/generate_s']:.2f}s", f"wait {row['time/wait_s']:.2f}s",
             f"{row['time/step_s']:.2f}s"]
    if "eval/accuracy" in row:
        parts.append(f"eval {row['eval/accuracy']:.3f}")
    print("[split] " + "  ".join(parts), flush=True)


# ---------------------------------------------------------------------------- the engine
def engine_loop(job: Job, link, loaded: tuple | None = None) -> None:
    """The engine's side: generate batch after batch, each with the weights it must be sampled
    with, and send each to the trainer; `loaded`: (Task, EngineModel) already read."""
    from ratchet.model.io import load_engine_model

    cfg = job.grpo
    laps = Laps()
    task = loaded[0] if loaded is not None else job.load_task()
    laps("task")
    model = loaded[1] if loaded is not None else load_engine_model(job.model_dir)
    configure_threads(model.cfg, 2)  # on a thread: the trainer's own setting, set again
    laps("model")
    # its rows: the groups in flight, a step's and the extra ones (partial rollouts)
    engine = job.make_engine(model, rows=(cfg.problems_per_step + cfg.extra_groups) * cfg.group_size)
    laps("engine")
    rollouts = Rollouts(task.prompts, cfg.group_size, cfg.max_new_tokens, cfg.temperature, cfg.seed,
                        cfg.problems_per_step, extra_groups=cfg.extra_groups,
                        max_staleness=cfg.max_staleness)
    start = link.recv()
    link.open_weights(start["weights_backend"])
    version = start["version"]
    if start["rollouts"] is not None:
        rollouts.load_state_dict(start["rollouts"])
    link.receive_weights_into(engine, model.cfg, job.device)
    laps("first weights, the trainer's start-up included")
    print(f"[split] engine ready in {laps.line()}", flush=True)

    last_needed = cfg.steps - 1 - cfg.ahead

    def receive_until(wanted: int) -> float:
        """Take the broadcasts up to version `wanted`; returns the seconds it took (waiting
        for the trainer's send included: the time the engine stood still for weights)."""
        nonlocal version
        t0 = time.perf_counter()
        while version < wanted:
            link.receive_weights_into(engine, model.cfg, job.device)
            version += 1
        return time.perf_counter() - t0

    for step in range(start["first_batch"], cfg.steps):
        received_s = receive_until(step - cfg.ahead)  # the weights this batch must be sampled with
        checksums = {k: list(v) for k, v in engine.weight_checksums().items()}  # for the trainer's parity check
        sampled_with, t0 = version, time.perf_counter()
        groups, stats = rollouts.collect(engine, step, version)
        message = {"step": step, "version": sampled_with, "generate_s": time.perf_counter() - t0,
                   "groups": [g.to_dict() for g in groups], "stats": stats,
                   "rollouts": rollouts.state_dict(), "weights_checksums": checksums}
        # the trainer broadcasts these before it takes this batch: receive them first (a
        # blocking send here would wait on a trainer waiting on its broadcast)
        message["receive_s"] = received_s + receive_until(min(step, last_needed))
        link.send(message)


def _engine_thread(job: Job, link: ThreadLink, loaded: tuple) -> None:
    try:
        engine_loop(job, link, loaded)
    except BaseException as error:  # the trainer's next recv raises it
        link.fail(error)


def _spawned_engine(rank: int, job_json: str, port: int) -> None:
    job = Job.from_json(job_json)
    init_process_group(rank, 2, port)
    link = ProcessLink(rank)
    engine_loop(job, link)
    link.close()
