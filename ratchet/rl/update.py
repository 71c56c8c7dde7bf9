"""One GRPO step, defined once: the colocated loop, the split trainer and the ablations'
trajectories all call `grpo_step` (roll-out groups in, metrics out)."""

from __future__ import annotations

import numpy as np
import torch

from ratchet.gap import gap_metrics
from ratchet.rl.comm import Comm
from ratchet.rl.experience import Experience, make_experience, pad
from ratchet.rl.loss import correction_weights, policy_loss
from ratchet.rl.rollout import Group
from ratchet.rl.settings import GRPOConfig
from ratchet.trainer.policy import to_device


def grpo_step(policy, optimizer, groups: list[Group], task, cfg: GRPOConfig, version: int,
              comm: Comm | None = None, engine=None, engine_sampled: bool = False) -> dict[str, float]:
    """Score the groups, update the fp32 masters, return the step's metrics over all workers.
    `version`: the updates the trainer's weights have seen; `engine` (exact_forward only):
    an idle engine holding the trainer's current weights, rounded, that scores the answers;
    `engine_sampled`: that engine drew the groups (colocated), see `exact_values`."""
    comm = comm or Comm()
    exp = make_experience(groups, task, cfg, version, next(policy.parameters()).device)
    if cfg.exact_forward:
        exp.exact = exact_values(exp, engine, cfg, engine_sampled)
    if cfg.num_minibatches > 1:  # the weights move between mini-batches: score all first
        score(policy, exp, cfg)
        exp.old, exp.weights = old_logprobs_and_weights(exp.mask, exp.stale, exp.trainer, exp.engine, cfg)
    totals = update(policy, optimizer, exp, cfg, comm, scored=cfg.num_minibatches > 1)
    return step_metrics(exp, totals, cfg, comm)


def exact_values(exp: Experience, engine, cfg: GRPOConfig, engine_sampled: bool) -> torch.Tensor:
    """The exact forward's values: the engine's log-probs of the kept answers at its current
    weights, [n, T]. A batch-invariant engine that drew every kept token at those weights
    (colocated: none stale) already recorded them: teacher forcing replays its sampling-time
    log-probs bit for bit (the decomposition's `exact` source, 0 on every token), so they are
    taken as they are. Otherwise (split: drawn one step behind) the engine scores the answers,
    all at once (the same bits in any grouping; one decode step per answer token costs the
    same for 8 answers as for 64)."""
    drawn_now = not bool(exp.stale[exp.mask].any())
    if engine_sampled and drawn_now and engine.batch_invariant:
        return exp.engine.clone()
    values = engine.score(exp.prompts, exp.responses, cfg.temperature)
    return pad(values, exp.mask.shape[1], device=exp.mask.device)


def make_optimizer(policy: torch.nn.Module, cfg: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW on the fp32 masters: on a GPU the fused kernel (a few launches, not a few per
    tensor); on the CPU the per-tensor loop, whose sums the recorded CPU runs hash."""
    on_gpu = next(policy.parameters()).is_cuda
    return torch.optim.AdamW(policy.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps,
                             weight_decay=cfg.weight_decay, foreach=False, fused=on_gpu or None)


# fp16 arithmetic: the loss times this before the backward pass, the gradients divided by it
# (both exact: a power of two), so that per-token gradients of a token mean over ~1e4 tokens
# (~1e-4) stay far above fp16's smallest normal number (6e-5) in the activations' gradients.
FP16_LOSS_SCALE = 2.0 ** 16


def loss_scale(cfg: GRPOConfig) -> float:
    return FP16_LOSS_SCALE if cfg.compute_dtype == "fp16" else 1.0


def micro_batches(rows, prompts, responses, size: int, max_tokens: int | None = None) -> list[list[int]]:
    """`rows` cut into micro-batches, shortest answers (prompt + response) first: a micro-batch
    is padded to its longest answer, so like goes with like. At most `size` answers each and,
    with `max_tokens`, at most that many padded tokens (answers x the longest; an answer longer
    than that goes alone): short answers share a pass, and no pass pads every answer to the
    step's longest (verl's dynamic batch size, by token budget). The loss is a sum over
    tokens, so the cut changes only the order of the gradient's additions."""
    length = lambda i: len(prompts[i]) + len(responses[i])
    batches, current = [], []
    for i in sorted(rows, key=length):  # stable: ties keep order; i is the longest so far
        if current and (len(current) == size or (max_tokens is not None and (len(current) + 1) * length(i) > max_tokens)):
            batches.append(current)
            current = []
        current.append(i)
    return batches + [current] if current else batches


def trainer_forwards(policy, exp: Experience, rows, cfg: GRPOConfig, with_entropy: bool):
    """(rows, the trainer's own log-probs [b, t], mask [b, t], entropy) per micro-batch."""
    for mb in micro_batches(rows, exp.prompts, exp.responses, cfg.micro_batch_size, cfg.micro_batch_tokens):
        lp, mask, ent = policy.token_logprobs([exp.prompts[i] for i in mb], [exp.responses[i] for i in mb],
                                              temperature=cfg.temperature, weight_dtype=cfg.weight_dtype,
                                              compute_dtype=cfg.compute_dtype, with_entropy=with_entropy,
                                              attention=cfg.attention,
                                              gradient_checkpointing=cfg.gradient_checkpointing)
        index = to_device(torch.tensor(mb, dtype=torch.long), exp.mask.device)  # not a list: its
        yield index, lp, mask, ent  # upload would wait for the GPU


def forwards(policy, exp: Experience, rows, cfg: GRPOConfig, with_entropy: bool):
    """(rows, log-probs [b, t] as the loss sees them, mask [b, t], entropy) per micro-batch."""
    for index, lp, mask, ent in trainer_forwards(policy, exp, rows, cfg, with_entropy):
        yield index, exp.forward_values(lp, index), mask, ent


def score(policy, exp: Experience, cfg: GRPOConfig) -> None:
    """The trainer's log-probs (and entropy) of the kept answers, no gradient."""
    with torch.no_grad():
        for rows, lp, _, ent in forwards(policy, exp, range(len(exp.responses)), cfg, with_entropy=True):
            exp.trainer[rows, :lp.shape[1]] = lp
            exp.entropy[rows, :lp.shape[1]] = ent


def old_logprobs_and_weights(mask, stale, trainer, engine, cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The ratio's denominator per token, and the loss weight per token. Fresh tokens take the
    trainer's log-probs (old_logprobs "trainer") and the policy loss's correction weight; the
    others take the engine's and weight 1 (their ratio already is the importance ratio)."""
    from_trainer = mask & ~stale if cfg.old_logprobs == "trainer" else torch.zeros_like(mask)
    old = torch.where(from_trainer, trainer, engine)  # [n, T]
    weights = correction_weights(cfg.is_correction, trainer, engine, from_trainer, cfg)
    return old, weights + (mask & ~from_trainer).float()


def update(policy, optimizer, exp: Experience, cfg: GRPOConfig, comm: Comm, scored: bool) -> dict:
    """One AdamW step per mini-batch over its micro-batches (backward_loss). The loss of a
    mini-batch is its token sum over its token count on all workers; the weights change only
    at the optimiser step."""
    params = list(policy.parameters())
    on_gpu, scale = params[0].is_cuda, loss_scale(cfg)
    totals = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "grad_norm": 0.0, "updates": 0, "skipped": 0}
    minibatches = np.array_split(np.arange(len(exp.responses)), cfg.num_minibatches)
    for minibatch in minibatches:
        num_tokens = comm.sum([float(exp.mask[minibatch].sum())])[0]
        if num_tokens == 0:
            continue  # every worker sees the same global count, so all skip together
        optimizer.zero_grad(set_to_none=False)
        queued = [torch.stack([loss.double(), sums["clipped"].double(), sums["ratio"].double()])
                  for loss, sums in backward_loss(policy, exp, minibatch.tolist(), num_tokens, cfg, scored,
                                                  scale)]
        # read back once, after every micro-batch's backward is queued (the same floats, in the
        # same order, as reading each as it came, without the GPU idling at every read)
        for loss, clipped, ratio in (torch.stack(queued).tolist() if queued else []):  # a worker may hold none
            totals["loss"] += loss / len(minibatches)
            totals["clipped"] += clipped
            totals["ratio"] += ratio
        comm.sum_grads(params)
        if scale != 1.0:
            torch._foreach_div_([p.grad for p in params], scale)
        norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=on_gpu))
        if not np.isfinite(norm):  # an fp16 overflow: every worker sees the same summed norm
            totals["skipped"] += 1
            continue
        totals["grad_norm"] += norm
        optimizer.step()
        totals["updates"] += 1
    return totals


def backward_loss(policy, exp: Experience, rows: list[int], num_tokens: float, cfg: GRPOConfig,
                  scored: bool, scale: float = 1.0):
    """The loss of `rows` (`num_tokens`: their token count on all workers) backwarded micro-batch
    by micro-batch into the parameters' .grad, times `scale` (loss_scale); yields (loss, sums)
    after each. Unless `scored`, each micro-batch's forward is its scoring one: it fills the
    trainer's side of `exp`. Yields (loss, sums) as 0-d tensors."""
    for mb, lp, mask, ent in forwards(policy, exp, rows, cfg, with_entropy=not scored):
        if scored:
            t = lp.shape[1]  # [b, t]
            loss, sums = policy_loss(lp, exp.old[mb, :t], exp.advantages[mb], mask, exp.weights[mb, :t],
                                     num_tokens, cfg.clip_eps_low, cfg.clip_eps_high)
        else:
            loss, sums = scoring_loss(exp, mb, lp, mask, ent, num_tokens, cfg)
        (loss * scale if scale != 1.0 else loss).backward()
        yield loss.detach(), sums  # tensors: reading them here would stall the GPU's queue


def scoring_loss(exp: Experience, mb, lp: torch.Tensor, mask, ent, num_tokens: float, cfg: GRPOConfig):
    """(loss, sums) of a micro-batch whose forward is its scoring one: `lp` (as the loss sees
    them) and the entropy fill the trainer's side of `exp`, and with them its old log-probs and
    loss weights."""
    t = lp.shape[1]  # [b, t]
    before = lp.detach()
    exp.trainer[mb, :t], exp.entropy[mb, :t] = before, ent.detach()
    old, weights = old_logprobs_and_weights(mask, exp.stale[mb, :t], before, exp.engine[mb, :t], cfg)
    exp.old[mb, :t], exp.weights[mb, :t] = old, weights
    return policy_loss(lp, old, exp.advantages[mb], mask, weights, num_tokens, cfg.clip_eps_low, cfg.clip_eps_high)


def step_metrics(exp: Experience, totals: dict, cfg: GRPOConfig, comm: Comm) -> dict[str, float]:
    mask, weights = exp.mask, exp.weights
    local = {"loss": totals["loss"], "clipped": totals["clipped"], "ratio": totals["ratio"],
             "grad_norm": totals["grad_norm"], "tokens": float(mask.sum()),
             "entropy": float(exp.entropy[mask].sum()), "seqs": float(len(exp.responses)),
             "answers": float(len(exp.rewards)), "reward": float(exp.rewards.sum()),
             "correct": float((exp.rewards >= 1).sum()), "length": float(exp.response_lengths.sum()),
             "truncated": float(sum(f == "length" for f in exp.finish_reasons)),
             "groups": float(len(set(exp.group_index.tolist()))),
             "kept_groups": float(len(set(exp.group_index[exp.keep].tolist()))),
             "stale": float((exp.stale & mask).sum()), "weight": float(weights[mask].sum()),
             "masked": float(((weights == 0) & mask).sum())}
    s = dict(zip(local, comm.sum(list(local.values()))))
    tokens = max(s["tokens"], 1.0)
    out = {
        "train/loss": s["loss"],
        "train/clip_fraction": s["clipped"] / tokens,
        "train/ratio_mean": s["ratio"] / tokens,
        "train/entropy": s["entropy"] / tokens,
        "train/grad_norm": s["grad_norm"] / max(totals["updates"], 1) / comm.world,
        "train/lr": cfg.lr,
        "train/num_updates": float(totals["updates"]),
        "train/nonfinite_skipped": float(totals["skipped"]),
        "train/num_tokens": s["tokens"],
        "train/num_sequences": s["seqs"],
        "train/reward": s["reward"] / s["answers"],
        "train/accuracy": s["correct"] / s["answers"],
        "train/response_length_mean": s["length"] / s["answers"],
        "train/response_length_max": comm.max(float(exp.response_lengths.max(initial=0))),
        "train/truncated_share": s["truncated"] / s["answers"],
        "train/groups_skipped_share": 1.0 - s["kept_groups"] / max(s["groups"], 1.0),
        "train/is_weight_mean": s["weight"] / tokens,
        "train/is_masked_share": s["masked"] / tokens,
        "rollout/stale_token_share": s["stale"] / tokens,
    }
    # the mismatch on the trained tokens: engine (sampling time) against trainer (before the update)
    e_all = comm.cat(exp.engine[mask].double().cpu().numpy())
    t_all = comm.cat(exp.trainer[mask].double().cpu().numpy())
    if len(e_all):
        out.update(gap_metrics(e_all, t_all, eps=max(cfg.clip_eps_low, cfg.clip_eps_high)))
        ratio = np.exp(t_all - e_all)
        out.update({"sampling/importance_sampling_ratio/min": float(ratio.min()),
                    "sampling/importance_sampling_ratio/mean": float(ratio.mean()),
                    "sampling/importance_sampling_ratio/max": float(ratio.max())})
    return out
