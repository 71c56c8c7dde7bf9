"""GRPO end to end on the tiny model, on CPU: rollouts, both loops, determinism, learning.

The model and data come from the pipeline's own first stages (tracking off) under a
temporary results dir, so these tests train exactly what `snakemake` would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ratchet.paths import RunPaths

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory, prepare):
    return prepare(tmp_path_factory.mktemp("grpo") / "results")


def short_job(cfg, mode, out, **kw):
    from ratchet.stages.train import make_job

    settings = dict(steps=4, problems_per_step=8, eval_every=0, checkpoints=False, save_model=False,
                    resume=False)
    settings.update(kw)
    return make_job(cfg, mode, out_dir=out, **settings)


def trace(out) -> pd.DataFrame:
    return pd.read_parquet(Path(out) / "trace.parquet")


# ---------------------------------------------------------------------------- rollouts
def _task(cfg):
    from ratchet.rl.task import Task

    paths = RunPaths.from_config(cfg)
    return Task.load(paths.model, paths.train_data, cfg["data"]["source"])


def _engine_and_prompts(cfg):
    from ratchet.engine.engine import Engine
    from ratchet.model.io import load_engine_model

    task = _task(cfg)
    model = load_engine_model(RunPaths.from_config(cfg).model)
    make = lambda: Engine(model, backend="numpy", max_batch_size=16, max_seq_len=64)  # noqa: E731
    return make, task.prompts


def test_partial_rollouts_with_fixed_weights_equal_uninterrupted_generation(cfg):
    from ratchet.engine.request import Request
    from ratchet.rl.rollout import Rollouts

    make_engine, prompts = _engine_and_prompts(cfg)
    engine = make_engine()
    G = 4
    rollouts = Rollouts(prompts, G, max_new_tokens=12, temperature=1.0, seed=7, groups_per_step=3,
                        extra_groups=3, max_staleness=100)
    returned, resumed = [], 0
    for step in range(6):
        groups, stats = rollouts.collect(engine, step, version=step)
        assert len(groups) == 3 and all(g.finished for g in groups)
        assert engine.num_unfinished == 0
        resumed += stats["rollout/resumed_answers"]
        returned += groups
    assert resumed > 0, "no answer was ever interrupted: the test proves nothing"
    # The same requests (ids, prompts, seed), generated in one go by a fresh engine
    fresh = make_engine()
    reqs = [Request(r.request_id, list(r.prompt), r.max_new_tokens, r.temperature, seed=r.seed)
            for g in returned for r in g.requests]
    fresh.generate(reqs)
    got = [r for g in returned for r in g.requests]
    assert [r.output for r in got] == [r.output for r in reqs]
    assert [r.logprobs for r in got] == [r.logprobs for r in reqs]  # bit for bit
    assert [r.finish_reason for r in got] == [r.finish_reason for r in reqs]
    # every token is labelled with the step that drew it, and interrupted ones span steps
    assert all(len(v) == len(r.output) for g in returned for r, v in zip(g.requests, g.versions))
    assert any(len(set(v)) > 1 for g in returned for v in g.versions)


def test_stale_groups_are_dropped_and_state_round_trips(cfg):
    from ratchet.rl.rollout import Rollouts

    make_engine, prompts = _engine_and_prompts(cfg)
    engine = make_engine()
    kw = dict(max_new_tokens=12, temperature=1.0, seed=3, groups_per_step=2, extra_groups=6,
              max_staleness=0)
    a = Rollouts(prompts, 4, **kw)
    dropped = 0
    for step in range(3):
        groups, stats = a.collect(engine, step, step)
        dropped += stats["rollout/dropped_groups"]
        assert all(step - g.born <= 0 for g in groups)
    assert dropped > 0
    state = json.loads(json.dumps(a.state_dict()))  # JSON, exactly
    b = Rollouts(prompts, 4, **kw)
    b.load_state_dict(state)
    ga, _ = a.collect(engine, 3, 3)
    gb, _ = b.collect(make_engine(), 3, 3)
    assert [g.to_dict() for g in ga] == [g.to_dict() for g in gb]


def test_rollout_state_is_a_snapshot_the_next_collect_leaves_alone(cfg):
    """state_dict is the moment's state, not views of it: the split engine on a thread hands it to
    the trainer, whose checkpoint writes it seconds later, while the unfinished answers in it
    grow at the next collect (the GPU resume of the twentieth session parted at the batch after
    the checkpoint for that)."""
    from ratchet.rl.rollout import Rollouts

    make_engine, prompts = _engine_and_prompts(cfg)
    engine = make_engine()
    rollouts = Rollouts(prompts, 4, max_new_tokens=12, temperature=1.0, seed=3, groups_per_step=2, extra_groups=6,
                        max_staleness=2)
    rollouts.collect(engine, 0, 0)
    state = rollouts.state_dict()
    then = json.dumps(state)
    lengths = {r["request_id"]: len(r["output"]) for g in state["in_flight"] for r in g["requests"]}
    for step in (1, 2):
        rollouts.collect(engine, step, step)
    live = [r for g in rollouts.in_flight for r in g.requests if r.request_id in lengths]
    assert any(len(r.output) > lengths[r.request_id] > 0 for r in live)  # answers cut at step 0 went on
    assert json.dumps(state) == then


def test_data_stream_is_seeded_and_shards_by_worker():
    from ratchet.rl.rollout import DataStream

    one = DataStream(10, seed=1)
    order = [one.next()[1] for _ in range(20)]
    assert sorted(order[:10]) == list(range(10)) and sorted(order[10:]) == list(range(10))
    assert order[:10] != order[10:]  # a new permutation each epoch
    two = [DataStream(10, seed=1, rank=r, world=2) for r in range(2)]
    interleaved = [two[i % 2].next()[1] for i in range(20)]
    assert interleaved == order


@pytest.mark.parametrize("correction", ["none", "tis"])
def test_one_pass_update_equals_score_then_update(cfg, correction):
    """The fused path (one mini-batch: the update's forward is the scoring forward) gives the
    same metrics and the same weights as scoring first, then updating."""
    import dataclasses

    import torch

    from ratchet.model.io import load_engine_model
    from ratchet.rl.comm import Comm
    from ratchet.rl.experience import Experience
    from ratchet.rl.rollout import Rollouts
    from ratchet.rl.settings import GRPOConfig
    from ratchet.rl.trace import weights_digest
    from ratchet.rl.update import make_optimizer, old_logprobs_and_weights, score, step_metrics, update
    from ratchet.trainer.policy import Policy

    make_engine, prompts = _engine_and_prompts(cfg)
    paths = RunPaths.from_config(cfg)
    task = _task(cfg)
    gcfg = dataclasses.replace(GRPOConfig.from_config(cfg), lr=1e-2, micro_batch_size=5,
                               is_correction=correction, tis_cap=1.001, problems_per_step=4)
    rollouts = Rollouts(prompts, gcfg.group_size, 8, 1.0, seed=3, groups_per_step=4)
    groups, _ = rollouts.collect(make_engine(), 0, version=0)
    reqs = [r for g in groups for r in g.requests]
    rewards = np.array([task.reward(r.output, task.targets[g.problem]) for g in groups for r in g.requests])

    def experience() -> Experience:
        # the untrained model scores every answer alike: train on all with made-up advantages
        return Experience.from_answers(
            [r.prompt for r in reqs], [list(r.output) for r in reqs], [list(r.logprobs) for r in reqs],
            [[i % 2] * len(r.output) for i, r in enumerate(reqs)],  # half stale
            rewards, np.random.default_rng(0).normal(size=len(reqs)),
            np.array([len(r.output) > 0 for r in reqs]), [r.finish_reason for r in reqs],
            np.repeat([g.index for g in groups], gcfg.group_size), version=1, device="cpu")

    model = load_engine_model(paths.model)
    out = []
    for fused in (True, False):
        torch.manual_seed(0)
        policy = Policy.from_weights(model.cfg, model.weights)
        optimizer = make_optimizer(policy, gcfg)
        exp = experience()
        if not fused:
            score(policy, exp, gcfg)
            exp.old, exp.weights = old_logprobs_and_weights(exp.mask, exp.stale, exp.trainer, exp.engine, gcfg)
        totals = update(policy, optimizer, exp, gcfg, Comm(), scored=not fused)
        out.append((step_metrics(exp, totals, gcfg, Comm()), weights_digest(policy)))
    (m1, w1), (m2, w2) = out
    assert m1["train/num_updates"] == 1 and w1 == w2
    assert m1.keys() == m2.keys()
    for k in m1:
        assert m1[k] == pytest.approx(m2[k], rel=1e-6, abs=1e-9), k


# ---------------------------------------------------------------------------- the loops
def test_colocated_runs_twice_bit_identically(cfg, tmp_path):
    from ratchet.rl.colocated import run_colocated

    a = run_colocated(short_job(cfg, "colocated", tmp_path / "a"))
    b = run_colocated(short_job(cfg, "colocated", tmp_path / "b"))
    assert a["weights_sha256"] == b["weights_sha256"]
    pd.testing.assert_frame_equal(trace(tmp_path / "a"), trace(tmp_path / "b"))
    metrics = pd.read_parquet(tmp_path / "a" / "metrics.parquet")
    for key in ("train/loss", "train/reward", "train/accuracy", "train/clip_fraction",
                "train/entropy", "train/response_length_mean", "train/num_tokens",
                "time/generate_s", "time/train_s", "time/sync_s", "time/step_s",
                "mismatch/logprob_abs_diff_mean", "mismatch/logprob_abs_diff_p99",
                "mismatch/logprob_abs_diff_max", "mismatch/logprob_diff_mean", "mismatch/kl_k3",
                "mismatch/ratio_outside_share", "rollout_corr/kl",
                "sampling/sampling_logp_difference/mean"):
        assert key in metrics.columns, key
    assert len(metrics) == 4


@pytest.mark.slow
def test_split_runs_twice_bit_identically_with_partial_rollouts(cfg, tmp_path):
    from ratchet.rl.split import run_split

    kw = dict(extra_groups=4, max_new_tokens=12)
    a = run_split(short_job(cfg, "split", tmp_path / "a", **kw))
    b = run_split(short_job(cfg, "split", tmp_path / "b", **kw))
    assert a["weights_sha256"] == b["weights_sha256"]
    pd.testing.assert_frame_equal(trace(tmp_path / "a"), trace(tmp_path / "b"))
    metrics = pd.read_parquet(tmp_path / "a" / "metrics.parquet")
    assert (metrics["rollout/weights_lag"].iloc[1:] == 1).all()  # one step ahead
    trained = metrics[(metrics["step"] > 0) & (metrics["train/num_tokens"] > 0)]
    assert len(trained) and (trained["rollout/stale_token_share"] > 0).all()
    assert metrics["rollout/resumed_answers"].sum() > 0  # partial rollouts did resume


def test_split_engine_on_a_thread_equals_engine_in_a_process(cfg, tmp_path):
    """The link changes where the engine runs, not what it computes: the same rollouts,
    losses and weights, bit for bit, with partial rollouts and one batch ahead."""
    from ratchet.rl.split import run_split

    kw = dict(extra_groups=4, max_new_tokens=8, steps=3)
    thread = run_split(short_job(cfg, "split", tmp_path / "thread", engine_in="thread", **kw))
    process = run_split(short_job(cfg, "split", tmp_path / "process", engine_in="process", **kw))
    assert (thread["engine_in"], process["engine_in"]) == ("thread", "process")
    assert thread["weights_sha256"] == process["weights_sha256"]
    pd.testing.assert_frame_equal(trace(tmp_path / "thread"), trace(tmp_path / "process"))
    lag = pd.read_parquet(tmp_path / "thread" / "metrics.parquet")["rollout/weights_lag"]
    assert lag.tolist() == [0, 1, 1]


def test_a_failing_engine_thread_stops_the_trainer_with_its_error(cfg, tmp_path, monkeypatch):
    from ratchet.rl import split

    def broken(job, link, loaded=None):
        link.recv()  # the start message
        raise RuntimeError("planted engine failure")

    monkeypatch.setattr(split, "engine_loop", broken)
    with pytest.raises(Exception, match="planted engine failure"):
        split.run_split(short_job(cfg, "split", tmp_path / "t", engine_in="thread", steps=2))


@pytest.mark.slow
def test_one_step_ahead_with_lr0_equals_synchronous(cfg, tmp_path):
    """With the weights held fixed, generating one batch ahead (split, ahead=1) gives the
    rollouts, losses and weights of the synchronous loops (split ahead=0 and colocated).
    The old log-probs are the engine's here: with ahead=1 every token is (nominally) stale
    and takes the engine's, so the synchronous runs must too for the losses to compare."""
    from ratchet.rl.colocated import run_colocated
    from ratchet.rl.split import run_split

    kw = dict(lr=0.0, old_logprobs="engine", extra_groups=0, max_new_tokens=6)
    run_split(short_job(cfg, "split", tmp_path / "ahead", ahead=1, **kw))
    run_split(short_job(cfg, "split", tmp_path / "sync", ahead=0, **kw))
    run_colocated(short_job(cfg, "colocated", tmp_path / "colocated", **kw))
    ahead, sync, colocated = (trace(tmp_path / n) for n in ("ahead", "sync", "colocated"))
    pd.testing.assert_frame_equal(ahead, sync)
    pd.testing.assert_frame_equal(ahead, colocated)
    lag = pd.read_parquet(tmp_path / "ahead" / "metrics.parquet")["rollout/weights_lag"]
    assert lag.tolist() == [0, 1, 1, 1]


def test_a_worker_whose_first_groups_all_tie_adds_zero_gradients(cfg, tmp_path):
    """With 8 problems over two workers, the second's four groups of step 0 all score alike
    (no answer kept): it ran no backward, its parameters had no .grad yet, and the gradient
    sum failed there (the first worker saw only gloo's "connection closed")."""
    from ratchet.rl.colocated import run_colocated

    kw = dict(steps=2, problems_per_step=8)
    two = run_colocated(short_job(cfg, "colocated", tmp_path / "w2", num_workers=2, **kw))
    run_colocated(short_job(cfg, "colocated", tmp_path / "w1", num_workers=1, **kw))
    m2, m1 = (pd.read_parquet(tmp_path / n / "metrics.parquet") for n in ("w2", "w1"))
    assert two["num_workers"] == 2 and m2["train/num_sequences"].tolist() == m1["train/num_sequences"].tolist()
    assert np.allclose(m2["train/grad_norm"], m1["train/grad_norm"], rtol=1e-4, atol=1e-7)


def test_colocated_two_gloo_workers_match_one(cfg, tmp_path):
    """Two data-parallel workers (gloo) take the stream positions one worker would, with the
    same request ids, so they sample the same answers; the summed gradients of their token
    sums over the global token count give the single worker's update up to float order."""
    from ratchet.rl.colocated import run_colocated

    kw = dict(steps=2, problems_per_step=16)
    two = run_colocated(short_job(cfg, "colocated", tmp_path / "w2", num_workers=2, **kw))
    run_colocated(short_job(cfg, "colocated", tmp_path / "w1", num_workers=1, **kw))
    assert two["num_workers"] == 2
    m2, m1 = (pd.read_parquet(tmp_path / n / "metrics.parquet") for n in ("w2", "w1"))
    for key in ("train/reward", "train/num_tokens", "train/num_sequences", "train/groups_skipped_share"):
        assert m2[key].tolist() == m1[key].tolist(), key
    for key in ("train/loss", "train/entropy", "train/grad_norm"):
        assert np.allclose(m2[key], m1[key], rtol=1e-4, atol=1e-7), (key, m2[key].tolist(), m1[key].tolist())
    # after an update the gap reads the engine's rounded weights, where a master that differs
    # in its last bit (float order) can round the other way: looser, but still tight
    key = "mismatch/logprob_abs_diff_mean"
    assert m2[key].iloc[0] == m1[key].iloc[0] and np.allclose(m2[key], m1[key], rtol=1e-3), (
        key, m2[key].tolist(), m1[key].tolist())


@pytest.mark.parametrize("mode", ["colocated", "split"])
def test_exact_forward_trains_as_the_fix_with_no_gap(cfg, tmp_path, mode):
    """train.exact_forward in both loops: the loss sees the engine's own log-probabilities
    (its engine holds the trainer's weights, rounded: the gap on the trained tokens is 0),
    and the gradient is the fix's, so the weights follow the fix run's bit for bit."""
    from ratchet.stages.train import run_mode

    kw = dict(round_weights=True, ahead=0, extra_groups=0, max_new_tokens=6)
    run_mode(short_job(cfg, mode, tmp_path / "fix", **kw), mode)
    run_mode(short_job(cfg, mode, tmp_path / "exact", exact_forward=True, **kw), mode)
    fix, exact = (pd.read_parquet(tmp_path / n / "metrics.parquet") for n in ("fix", "exact"))
    trained = exact["train/num_tokens"] > 0
    assert trained.sum() >= 2
    assert (exact.loc[trained, "mismatch/logprob_abs_diff_max"] == 0).all()
    assert (fix.loc[trained, "mismatch/logprob_abs_diff_max"] > 0).all()
    assert trace(tmp_path / "fix")["weights"].tolist() == trace(tmp_path / "exact")["weights"].tolist()


def test_verify_reports_identical_reruns(cfg, tmp_path):
    from ratchet.stages.train import run_mode
    from ratchet.stages.verify import compare_traces

    run_mode(short_job(cfg, "colocated", tmp_path / "ref", steps=3), "colocated")
    run_mode(short_job(cfg, "colocated", tmp_path / "new", steps=2), "colocated")
    result = compare_traces(trace(tmp_path / "ref"), trace(tmp_path / "new"))
    assert result["identical"] and result["steps_compared"] == 2, result
    # a changed quantity is found, at its first step
    ref = trace(tmp_path / "ref")
    bad = ref.copy()
    bad.loc[bad["step"] == 1, "loss"] = "0x1p+0"
    bad.loc[bad["step"] == 2, "tokens"] = "0"
    result = compare_traces(ref, bad)
    assert not result["identical"]
    assert result["first_divergence"] == {"step": 1, "quantity": "loss"}
    assert result["quantities"]["tokens"]["first_step"] == 2


# ---------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_tiny_default_learns_in_both_modes(tmp_path, prepare):
    """The default profile, as the pipeline runs it (`python -m ratchet train_<mode>`, the two
    modes at the same time, as the split trainer mostly waits on its engine): greedy accuracy
    on the synthetic test split rises from the baseline by over 0.3, and by over 5 standard
    errors, in both modes. Where it ends depends on the CPU (its float summation orders steer
    the trajectory; each machine reruns bit for bit): 0.5-0.93 on the machines seen."""
    import subprocess
    import sys

    from ratchet.stages import run_stage

    cfg = prepare(tmp_path / "results")
    paths = RunPaths.from_config(cfg)
    # as the rules start them: the validated config through the environment (two hand-run
    # stages would refuse to share the run directory)
    env = {**os.environ, "RATCHET_TRACKING": "off", "RATCHET_CONFIG_JSON": json.dumps(cfg)}
    cli = lambda mode: [sys.executable, "-m", "ratchet", f"train_{mode}", "--config-from-env"]  # noqa: E731
    procs = {m: subprocess.Popen(cli(m), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for m in ("colocated", "split")}
    logs = {m: p.communicate(timeout=600)[0] for m, p in procs.items()}
    for m, p in procs.items():
        assert p.returncode == 0, logs[m][-3000:]
    run_stage("eval_baseline", cfg)
    baseline = json.loads(paths.eval_json("baseline").read_text())["accuracy"]
    for mode in ("colocated", "split"):
        run_stage(f"eval_after_{mode}", cfg)
        result = json.loads(paths.eval_json(f"after_{mode}").read_text())
        after, stderr = result["accuracy"], result["accuracy_stderr"]
        summary = json.loads(paths.train_summary(mode).read_text())
        print(f"{mode}: greedy accuracy {baseline:.3f} -> {after:.3f} in {summary['steps']} steps, "
              f"{summary['train_s']:.0f} s of training")
        assert after - baseline > max(0.3, 5 * stderr), (mode, baseline, after, logs[mode][-2000:])


def test_micro_batches_group_answers_of_like_length():
    from ratchet.rl.update import micro_batches

    prompts = [[1] * 3] * 6
    responses = [[2] * n for n in (9, 1, 5, 2, 8, 1)]
    batches = micro_batches(range(6), prompts, responses, 2)
    assert batches == [[1, 5], [3, 2], [4, 0]]  # by length, ties in arrival order
    assert sorted(sum(batches, [])) == list(range(6))


def test_a_token_budget_cuts_micro_batches_by_padded_tokens():
    from ratchet.rl.update import micro_batches

    prompts = [[1] * 3] * 6
    responses = [[2] * n for n in (9, 1, 5, 2, 8, 1)]  # answers of 12, 4, 8, 5, 11, 4 tokens
    batches = micro_batches(range(6), prompts, responses, 6, max_tokens=16)
    assert batches == [[1, 5, 3], [2], [4], [0]]  # 3 x 5, then 8 alone (2 x 8 = 16 fits, 3 x 11 not)
    padded = [len(b) * max(len(prompts[i]) + len(responses[i]) for i in b) for b in batches]
    assert padded == [15, 8, 11, 12] and all(p <= 16 for p in padded)
    # an answer longer than the budget goes alone; the row cap still holds; no budget = by rows
    assert micro_batches(range(6), prompts, responses, 6, max_tokens=5) == [[1], [5], [3], [2], [4], [0]]
    assert micro_batches(range(6), prompts, responses, 2, max_tokens=1000) == micro_batches(range(6), prompts, responses, 2)


def test_a_token_budget_trains_the_weights_a_row_count_does(cfg):
    """The loss is a token sum over the step's token count: cutting the same answers into other
    micro-batches changes only the order of the gradient's additions. Compared through an SGD
    step of lr 1, whose update is the (clipped) gradient itself: AdamW's first step divides
    each gradient by its own magnitude, which turns last-bit differences of near-zero
    gradients into visible ones."""
    import dataclasses

    import torch

    from ratchet.model.io import load_engine_model
    from ratchet.rl.comm import Comm
    from ratchet.rl.experience import Experience
    from ratchet.rl.rollout import Rollouts
    from ratchet.rl.settings import GRPOConfig
    from ratchet.rl.update import forwards, update
    from ratchet.trainer.policy import Policy

    make_engine, prompts = _engine_and_prompts(cfg)
    task = _task(cfg)
    base = dataclasses.replace(GRPOConfig.from_config(cfg), lr=1e-2, problems_per_step=4)
    rollouts = Rollouts(prompts, base.group_size, 8, 1.0, seed=3, groups_per_step=4)
    groups, _ = rollouts.collect(make_engine(), 0, version=0)
    reqs = [r for g in groups for r in g.requests]
    model = load_engine_model(RunPaths.from_config(cfg).model)
    lengths = sorted(len(r.prompt) + len(r.output) for r in reqs)
    budget = 3 * lengths[len(lengths) // 2]
    weights, passes = [], []
    for gcfg in (dataclasses.replace(base, micro_batch_size=len(reqs), micro_batch_tokens=None),
                 dataclasses.replace(base, micro_batch_size=len(reqs), micro_batch_tokens=budget)):
        torch.manual_seed(0)
        policy = Policy.from_weights(model.cfg, model.weights)
        exp = Experience.from_answers(
            [r.prompt for r in reqs], [list(r.output) for r in reqs], [list(r.logprobs) for r in reqs],
            [[0] * len(r.output) for r in reqs], np.zeros(len(reqs)), np.random.default_rng(0).normal(size=len(reqs)),
            np.array([len(r.output) > 0 for r in reqs]), [r.finish_reason for r in reqs],
            np.repeat([g.index for g in groups], gcfg.group_size), version=0, device="cpu")
        passes.append(sum(1 for _ in forwards(policy, exp, range(len(exp.responses)), gcfg, with_entropy=False)))
        update(policy, torch.optim.SGD(policy.parameters(), lr=1.0), exp, gcfg, Comm(), scored=False)
        weights.append(policy.export_weights())
    assert passes[0] == 1 and passes[1] > 2  # the budget did cut the step
    grads = [{k: weights[i][k] - torch.as_tensor(model.weights[k]) for k in weights[i]} for i in (0, 1)]
    scale = max(float(g.abs().max()) for g in grads[0].values())
    assert scale > 1e-4  # the step did train
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=0, atol=1e-5 * scale, msg=k)


@pytest.mark.parametrize("last, computed", [({"step": 2, "weights": "abc"}, False),
                                            ({"step": 1, "weights": "abc"}, True),
                                            ({"step": 2, "weights": ""}, True)])
def test_the_summary_takes_the_weights_digest_of_the_last_step_from_the_trace(tmp_path, monkeypatch,
                                                                               last, computed):
    """The masters' SHA-256 is taken once at the last step (a device-to-host copy of every
    weight and a pass of SHA-256): the summary reuses it, and computes it only where the trace
    lacks it."""
    import dataclasses

    from ratchet.config import validate
    from ratchet.rl import job as job_module
    from ratchet.rl.job import Job, write_outputs
    from ratchet.rl.settings import GRPOConfig

    calls = []
    monkeypatch.setattr(job_module, "weights_digest", lambda policy: calls.append(policy) or "computed")
    grpo = dataclasses.replace(GRPOConfig.from_config(validate({})), steps=3)
    job = Job(grpo=grpo, model_dir="", train_path="", data_source="synthetic", out_dir=str(tmp_path),
              save_model=False)
    rows = [{"step": 2, "train/loss": 0.5}]
    summary = write_outputs(job, "policy", None, rows, [{"tokens": "t", "logprobs": "l", "loss": "0x0p+0", **last}])
    assert summary["weights_sha256"] == ("computed" if computed else "abc")
    assert calls == (["policy"] if computed else [])


def test_an_engine_sized_to_its_rows_runs_every_step_in_the_bucket_it_had():
    """A training engine holds only the rows it will run (a KV cache for them alone); for any
    count of rows in flight up to that, the decode bucket is the one the full-size engine
    would pick, so the same kernels and the same bits."""
    from ratchet.engine.cuda.graphs import buckets_for

    def bucket(buckets, n):
        return next(b for b in buckets if b >= n)

    for rows in (1, 7, 64, 96, 200, 512):
        for n in range(1, rows + 1):
            assert bucket(buckets_for(rows), n) == bucket(buckets_for(512), n), (rows, n)


def test_the_training_engines_hold_the_rows_they_run(cfg, tmp_path, monkeypatch):
    """colocated: a step's answers or the eval's problems; split: the groups in flight (a
    step's and the extra ones) on the engine, the eval's problems on the trainer's own."""
    from ratchet.model.io import load_engine_model
    from ratchet.rl.colocated import run_colocated
    from ratchet.rl.job import Job
    from ratchet.rl.split import run_split

    job = short_job(cfg, "colocated", tmp_path / "c", steps=1)
    model = load_engine_model(job.model_dir)
    assert job.make_engine(model).max_batch_size == job.max_batch_size
    assert job.make_engine(model, rows=5).max_batch_size == 5
    assert job.make_engine(model, rows=10 ** 6).max_batch_size == job.max_batch_size

    made = []
    make = Job.make_engine

    def recording(self, model, batch_invariant=False, device=None, rows=None):
        engine = make(self, model, batch_invariant, device, rows)
        made.append(engine.max_batch_size)
        return engine

    monkeypatch.setattr(Job, "make_engine", recording)
    g, most = job.grpo, job.max_batch_size
    run_colocated(short_job(cfg, "colocated", tmp_path / "c", steps=1, eval_every=1, eval_problems=3))
    assert made == [min(most, g.problems_per_step * g.group_size)]  # more than the 3 eval problems
    made.clear()
    run_split(short_job(cfg, "split", tmp_path / "s", steps=1, eval_every=1, eval_problems=3,
                        problems_per_step=2, engine_in="thread"))
    assert sorted(made) == sorted([min(most, (2 + g.extra_groups) * g.group_size),  # the engine's
                                   min(most, 2 * g.group_size)])  # the trainer's, for its evals
