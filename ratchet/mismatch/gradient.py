"""What the gap does to the gradient. On one fresh batch of the engine's rollouts, the policy
gradient of every variant (GRADIENT_VARIANTS) against the on-policy one, after counts of
updates of the decomposition's plain GRPO run (decompose.along_updates, `gradient_at`); no
optimiser step is taken, and the run's own rollouts are not touched (each dtype's batch comes
from a Rollouts of its own seed, on that dtype's measuring engine synced from the masters).

The gradient is update()'s (backward_loss over the whole batch as one mini-batch), before
its norm is clipped: every parameter, flattened, compared in float64."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import torch

from ratchet.mismatch.ablation import AblateSettings, Trajectory
from ratchet.rl.settings import GRPOConfig

# variant -> (the FIX_RUNS run whose GRPO knobs it takes, overrides of those)
GRADIENT_VARIANTS: dict[str, tuple[str, dict]] = {
    # the fp32 forward, old = its own log-probs (ratio 1), no correction: the on-policy gradient
    "reference": ("none", {}),
    # old = the engine's sampling-time log-probs, no correction: a framework that trusts them
    "engine_old": ("none", {"old_logprobs": "engine"}),
    "tis": ("tis", {}),  # old = the trainer's, the loss weighted by min(pi_trainer / pi_engine, cap)
    "mis": ("mis", {}),  # old = the trainer's, tokens whose ratio leaves [low, high] masked
    "fix": ("fix", {}),  # the forward on the masters rounded to the engine dtype, old = its own
    # the fix with the engine's teacher-forced values as its forward's: old = the engine's
    # sampling-time log-probs, as engine_old, and now they are the trainer's own
    "exact": ("exact", {"old_logprobs": "engine"}),
}
# the variants whose gradients can agree bit for bit, and then share one backward (a micro-batch
# at a time) and one held gradient (variant_gradients): batch_rows' passes take whole sets
# (gradient_passes). (reference, mis): MIS masks only tokens whose ratio leaves [mis_low,
# mis_high], and a micro-batch where none does gives the reference's loss (at 1.5B every
# micro-batch of 4 of the 10 batches: after 0 and 30 updates); where they part, the first pass
# builds two gradients, as every later pass holds the reference's and one more. (fix, exact): both
# ratios are 1 at their own forward's values (the fix's old log-probs are its own; the exact fix's
# values and old log-probs are both the engine's), so their losses agree; were they to part, their
# pass would hold one more gradient for that batch. The same bits either way.
SHARING_SETS: tuple[tuple[str, ...], ...] = (("reference", "mis"), ("engine_old",), ("tis",), ("fix", "exact"))
SEED_OFFSET = 1000  # the fresh batch after u updates: Rollouts seed = seed + SEED_OFFSET + u


def variant_config(settings: AblateSettings, variant: str, dtype: str) -> GRPOConfig:
    """The GRPOConfig of one variant for an engine of `dtype`."""
    if variant not in GRADIENT_VARIANTS:
        raise ValueError(f"gradient variant {variant!r} is not one of {tuple(GRADIENT_VARIANTS)}")
    run, overrides = GRADIENT_VARIANTS[variant]
    return dataclasses.replace(settings.grpo(run), engine_dtype=dtype, **overrides)


def fresh_groups(engine, task, cfg: GRPOConfig, seed: int, max_tries: int = 20) -> list:
    """One step's groups (problems_per_step x group_size) from a Rollouts of seed `seed`,
    drawn again on the next problems until some group's answers scored differently (a batch
    of constant groups has no gradient)."""
    from ratchet.rl.experience import make_experience
    from ratchet.rl.rollout import Rollouts

    rollouts = Rollouts(task.prompts, cfg.group_size, cfg.max_new_tokens, cfg.temperature, seed,
                        cfg.problems_per_step)
    for step in range(max_tries):
        groups, _ = rollouts.collect(engine, step, version=0)
        if make_experience(groups, task, cfg, version=0).mask.any():
            return groups
    raise RuntimeError(f"the gradient ablation: every group scored the same in {max_tries} fresh batches "
                       "(raise ablate.max_steps_per_update or ablate.group_size)")


def forward_key(cfg: GRPOConfig) -> tuple:
    """What decides a variant's forward pass: variants equal in it share one (the loss's
    weighting of the tokens, its old log-probs and the exact forward's values come after)."""
    return (cfg.weight_dtype, cfg.compute_dtype, cfg.temperature, cfg.attention, cfg.micro_batch_size,
            cfg.micro_batch_tokens, cfg.gradient_checkpointing)


def variant_gradients(policy, groups: list, task, cfgs: list[GRPOConfig], engine=None, laps=None,
                      counts: dict | None = None) -> list[tuple]:
    """[(gradient per parameter, the Experience its forward filled)] per cfg: the policy gradient
    of the whole batch of `groups` under each (update's arithmetic, one mini-batch, no clipping,
    no optimiser step); `engine` (exact_forward only) scores the answers. The cfgs share one
    forward_key, so each micro-batch's forward runs once; each cfg's loss gives its gradient at
    the forward's log-probs, and the cfgs whose gradients there agree bit for bit (MIS inside
    its band and the reference, the fix and the exact fix) share one backward through the graph
    below them: the same saved tensors, kernels and upstream bits as a forward and backward of
    their own, so each gradient is the bits of `loss.backward()` alone
    (tests/test_gradient_error.py). The parameters' .grad are left as found. `laps`
    (runtime.Laps): the engine's scoring apart; `counts`, where given, gets "forwards" (a
    micro-batch's), "backwards" and "losses" added (how many passes the sharing saved)."""
    from ratchet.rl.experience import make_experience
    from ratchet.rl.update import exact_values, scoring_loss, trainer_forwards

    if len({forward_key(c) for c in cfgs}) != 1:
        raise ValueError(f"variant_gradients: the cfgs' forwards differ {sorted({forward_key(c) for c in cfgs})}")
    params = list(policy.parameters())
    exps = [make_experience(groups, task, c, version=0, device=params[0].device) for c in cfgs]
    if laps is not None and any(c.exact_forward for c in cfgs):
        laps("gradients: passes")  # the groups' passes before this one's
    for exp, c in zip(exps, cfgs):
        if c.exact_forward:
            exp.exact = exact_values(exp, engine, c, engine_sampled=False)  # scored: a measurement
            if laps is not None:
                laps("gradients: exact scoring")
    tokens = [float(exp.mask.sum()) for exp in exps]
    # the cfgs whose .grad so far are one list (of None before any backward), and that list
    shared: list[tuple[list[int], list]] = [(list(range(len(cfgs))), [None] * len(params))]
    saved = [p.grad for p in params]
    try:
        for mb, lp, mask, ent in trainer_forwards(policy, exps[0], list(range(len(exps[0].responses))),
                                                  cfgs[0], with_entropy=True):
            upstream = []  # each cfg's gradient at lp, as update.backward_loss's loss gives it
            for i, (exp, c) in enumerate(zip(exps, cfgs)):
                loss, _ = scoring_loss(exp, mb, exp.forward_values(lp, mb), mask, ent, tokens[i], c)
                upstream.append(torch.autograd.grad(loss, lp)[0])
            jobs = []  # (the cfgs a backward serves, their .grad before it, its upstream)
            for members, grads in shared:
                for k, same in enumerate(_bit_equal_classes(members, upstream)):
                    # where cfgs that shared .grad part, each further part takes a copy of them
                    own = grads if k == 0 else [None if g is None else g.clone() for g in grads]
                    jobs.append((same, own, upstream[same[0]]))
            shared = []
            for k, (same, grads, up) in enumerate(jobs):
                for p, g in zip(params, grads):
                    p.grad = g
                torch.autograd.backward(lp, up, retain_graph=k < len(jobs) - 1)
                shared.append((same, [p.grad for p in params]))
            if counts is not None:
                counts["forwards"] = counts.get("forwards", 0) + 1
                counts["backwards"] = counts.get("backwards", 0) + len(jobs)
                counts["losses"] = counts.get("losses", 0) + len(cfgs)
        held = {i: grads for members, grads in shared for i in members}
        return [([torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, held[i])], exp)
                for i, exp in enumerate(exps)]
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def _bit_equal_classes(members: list[int], tensors: list[torch.Tensor]) -> list[list[int]]:
    """`members` grouped by bit-equal tensors (first seen first): equal floats are not enough,
    since -0.0 == 0.0 and NaN != NaN would join or split what the bits do not."""
    classes: list[list[int]] = []
    for i in members:
        bits = tensors[i].contiguous().view(torch.uint8)
        for c in classes:
            if torch.equal(bits, tensors[c[0]].contiguous().view(torch.uint8)):
                c.append(i)
                break
        else:
            classes.append([i])
    return classes


def batch_gradient(policy, groups: list, task, cfg: GRPOConfig, engine=None):
    """(gradient per parameter, the Experience its forward filled) of one cfg (variant_gradients)."""
    return variant_gradients(policy, groups, task, [cfg], engine)[0]


def compare_gradients(grads: list[torch.Tensor], ref: list[torch.Tensor]) -> dict[str, float]:
    """Cosine similarity and |g - ref| / |ref| over all parameters (float64), |g| and |ref|.
    The difference is made in g's own float64 copy, in place: two float64 copies of a parameter
    at a time, not four (the 1.5B's embedding: 3.7 GB, not 7.5), the same operations and bits.
    The four sums run on the gradients' device, in the same order and float64 arithmetic as
    Python's floats would, and are read once: not four reads a parameter, each waiting for the
    GPU (~1,200 a comparison, long waits on a GPU shared with other jobs)."""
    sums = None  # dot, sq, ref_sq, diff_sq
    for g, r in zip(grads, ref):
        g64, r64 = g.detach().double().flatten(), r.detach().double().flatten()
        if g64.data_ptr() == g.data_ptr():  # g was float64 already: its copy, not g itself
            g64 = g64.clone()
        # the list's items in order: the three products before the difference overwrites g64
        terms = torch.stack([torch.dot(g64, r64), torch.dot(g64, g64), torch.dot(r64, r64),
                             torch.sum(g64.sub_(r64).pow_(2))])
        sums = terms if sums is None else sums + terms
        del g64, r64
    dot, sq, ref_sq, diff_sq = (0.0,) * 4 if sums is None else sums.tolist()
    # sqrt(sq * ref_sq), not |g| |ref|: for g = ref it is sq exactly, and the cosine 1
    scale = math.sqrt(sq * ref_sq)
    cosine = max(-1.0, min(1.0, dot / scale)) if scale > 0 else math.nan
    return {"cosine": cosine, "rel_diff": math.sqrt(diff_sq / ref_sq) if ref_sq > 0 else math.nan,
            "norm": math.sqrt(sq), "ref_norm": math.sqrt(ref_sq)}


def gradient_passes(cfgs: dict[str, GRPOConfig], at_once: int | None,
                    sets: tuple[tuple[str, ...], ...] = SHARING_SETS) -> list[list[str]]:
    """batch_rows' passes, the variants of each: per forward (the reference's first), its
    sharing sets in `sets`' order, at most `at_once` sets a pass (None: all of a forward's),
    the reference first of all (its gradient is what every other is compared with). A set's
    variants must share a forward (forward_key, which the dtypes decide) to share a backward."""
    named = [v for s in sets for v in s]
    if sorted(named) != sorted(cfgs):
        raise ValueError(f"the sharing sets {sets} do not hold each of the variants {tuple(cfgs)} once")
    by_forward: dict[tuple, list[list[str]]] = {}
    for s in sorted(sets, key=lambda s: "reference" not in s):
        keys = {forward_key(cfgs[v]) for v in s}
        if len(keys) != 1:
            raise ValueError(f"the sharing set {s} spans {len(keys)} forwards: its variants cannot share a backward")
        by_forward.setdefault(keys.pop(), []).append(sorted(s, key=lambda v: v != "reference"))
    passes = []
    for group in by_forward.values():
        size = at_once or len(group)
        passes += [[v for s in group[i:i + size] for v in s] for i in range(0, len(group), size)]
    return passes


def batch_rows(policy, engine, groups: list, task, settings: AblateSettings, laps=None,
               counts: dict | None = None) -> list[dict]:
    """Every variant's gradient of the same batch against the reference's: one row each. The
    variants of one forward (the reference's four on the fp32 masters; the fix and the exact fix
    on the rounded ones) share it (variant_gradients), the reference's first, at most
    `settings.gradients_at_once` of their SHARING_SETS a pass (gradient_passes; each further pass
    its own forward, the reference's gradient held throughout: the same bits, fewer gradients
    held at once). A set travels whole since its variants can share one backward and one
    gradient: at 1 a batch takes four forwards (six a variant a pass) and four to six backwards."""
    dtype = engine.dtype
    cfgs = {v: variant_config(settings, v, dtype) for v in GRADIENT_VARIANTS}
    passes = gradient_passes(cfgs, settings.gradients_at_once)
    found, ref = {}, None
    for names in passes:
        for v, (grads, exp) in zip(names, variant_gradients(policy, groups, task, [cfgs[v] for v in names],
                                                            engine, laps, counts)):
            ref = ref or (grads, exp)  # the reference's group comes first, the reference first in it
            found[v] = (compare_gradients(grads, ref[0]), exp)
        del grads  # the pass's last gradients, before the next pass's are made (ref's stay)
    ref_exp = ref[1]
    mask = ref_exp.mask
    gap = (ref_exp.engine - ref_exp.trainer)[mask].double().abs()  # the trainer's own log-probs
    rows = []
    for variant in GRADIENT_VARIANTS:
        cfg, (compared, exp) = cfgs[variant], found[variant]
        ratio = torch.exp(exp.trainer - exp.old)[mask].double()  # as the loss sees it
        rows.append({"engine_dtype": dtype, "variant": variant, "weight_dtype": cfg.weight_dtype,
                     "old_logprobs": cfg.old_logprobs, "is_correction": cfg.is_correction,
                     "exact_forward": cfg.exact_forward, **compared,
                     "ratio_max_dev": float((ratio - 1).abs().max()),
                     "weight_mean": float(exp.weights[mask].double().mean()),
                     "num_tokens": int(mask.sum()), "gap_mean": float(gap.mean()),
                     "gap_max": float(gap.max())})
    return rows


def gradient_rows(traj: Trajectory, engine, task, settings: AblateSettings, updates: int,
                  laps=None, counts: dict | None = None) -> list[dict]:
    """The rows of one engine dtype after `updates` updates of `traj`: `engine` (of that dtype,
    not the trajectory's) is synced from the masters and draws a fresh batch from a Rollouts of
    its own seed, on which every variant's gradient is compared with the reference's. `laps`
    (runtime.Laps): the batch's rollouts, the exact fix's scoring and the passes apart; `counts`:
    variant_gradients'."""
    from ratchet.rl.sync import sync_weights

    sync_weights(engine, traj.policy)
    cfg = dataclasses.replace(traj.cfg, engine_dtype=engine.dtype)
    groups = fresh_groups(engine, task, cfg, settings.seed + SEED_OFFSET + updates,
                          settings.max_steps_per_update)
    if laps is not None:
        laps("gradients: rollouts")
    rows = [{"updates": updates, "steps": traj.step, **r}
            for r in batch_rows(traj.policy, engine, groups, task, settings, laps, counts)]
    if laps is not None:
        laps("gradients: passes")
    return rows


def gather_dtypes(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The parts of one engine dtype each (gradient_rows along the run), in the rows' order of
    one run measuring every dtype in turn: by update count, then the parts' order."""
    frame = pd.concat(parts, ignore_index=True)
    return frame.sort_values("updates", kind="stable", ignore_index=True)
