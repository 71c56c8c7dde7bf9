"""What the colocated and split loops share: the settings, the task, one GRPO update.

    cfg     = GRPOConfig.from_config(config)   # the `train:` section, checked
    batch   = make_batch(groups, task, cfg)     # rewards, advantages, skipped groups
    metrics = train_on_batch(policy, optimizer, batch, cfg, version=step, comm=comm)

`train_on_batch` first scores the batch with the trainer, without gradients: those are the
"old" log-probabilities (when `old_logprobs` is "trainer") and the trainer's side of the
mismatch metrics. Then, per mini-batch, micro-batches of answers run forward and backward,
the gradients of all workers are summed, clipped and applied by AdamW to the fp32 masters.
Tokens sampled under older weights than the trainer's (partial rollouts, one step ahead)
always take the engine's sampling-time log-probabilities as "old": the PPO ratio then is the
importance ratio to the policy that actually drew them.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from ratchet.mismatch.metrics import gap_metrics
from ratchet.rl import loss as L
from ratchet.rl.rollout import Group


@dataclass
class GRPOConfig:
    """The `train:` section (defaults: the tiny profile's), plus the seed and engine dtype."""
    steps: int = 140
    problems_per_step: int = 32
    group_size: int = 8
    max_new_tokens: int = 2
    temperature: float = 1.0
    lr: float = 2e-3
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    advantage: str = "std"  # "std" (GRPO) or "none" (Dr. GRPO)
    skip_constant_groups: bool = True
    old_logprobs: str = "trainer"  # "trainer" (recomputed) or "engine" (sampling time)
    is_correction: str = "none"  # "none", "tis", "mis"
    is_level: str = "token"  # "token" or "sequence"
    tis_cap: float = 2.0
    mis_low: float = 0.5
    mis_high: float = 2.0
    round_weights: bool = False  # the fix: forward on weights rounded to the engine dtype
    # the exact fix: the forward's values are the engine's own (teacher forcing through its
    # batch-invariant kernels, Batch.exact_logprobs), its gradient the rounded-weight forward's
    exact_forward: bool = False
    compute_dtype: str = "fp32"
    num_minibatches: int = 1
    micro_batch_size: int = 256
    num_workers: int = 1
    ahead: int = 1  # split: batches the engine runs ahead of the trainer
    extra_groups: int = 4  # split: groups in flight beyond what a step trains on
    max_staleness: int = 2  # split: drop groups started more than this many steps ago
    checkpoint_every: int = 20
    keep_checkpoints: int = 2
    eval_every: int = 20
    eval_problems: int = 100
    verify_steps: int = 3
    seed: int = 0
    engine_dtype: str = "fp16"

    def __post_init__(self):
        self.betas = tuple(self.betas)
        checks = [
            (self.steps >= 1, "steps must be >= 1"),
            (self.group_size >= 2, "group_size must be >= 2 (an advantage needs a group)"),
            (self.problems_per_step % self.num_workers == 0,
             f"problems_per_step {self.problems_per_step} must be a multiple of "
             f"num_workers {self.num_workers}"),
            (self.advantage in L.ADVANTAGE_SCALES, f"advantage must be one of {L.ADVANTAGE_SCALES}"),
            (self.old_logprobs in ("trainer", "engine"), "old_logprobs must be 'trainer' or 'engine'"),
            (self.is_correction in L.IS_CORRECTIONS, f"is_correction must be one of {L.IS_CORRECTIONS}"),
            (self.is_level in L.IS_LEVELS, f"is_level must be one of {L.IS_LEVELS}"),
            (self.ahead in (0, 1), "split.ahead must be 0 (synchronous) or 1 (one step ahead)"),
            (self.temperature > 0, "temperature must be > 0"),
            (self.round_weights or not self.exact_forward, "exact_forward needs round_weights"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"config train: {message}")

    @classmethod
    def from_config(cls, cfg: dict) -> "GRPOConfig":
        t = dict(cfg["train"])
        t.update(t.pop("split", {}))
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in t.items() if k in names}, seed=cfg["seed"],
                   engine_dtype=cfg["engine"]["dtype"])

    @property
    def weight_dtype(self) -> str:
        return self.engine_dtype if self.round_weights else "fp32"

    @property
    def groups_per_worker(self) -> int:
        return self.problems_per_step // self.num_workers


# ---------------------------------------------------------------------------- the task
@dataclass
class Task:
    """Prompts and targets of the training split, and the reward of a response."""
    prompts: list[list[int]]
    targets: list[str]
    tokenizer: object
    eval_prompts: list[list[int]] = field(default_factory=list)
    eval_targets: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, model_dir, train_path, data_source: str, test_path=None,
             eval_problems: int = 0) -> "Task":
        from ratchet.data.datasets_io import load_split
        from ratchet.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(model_dir)
        prompt_fn = make_prompt_fn(tokenizer, data_source)
        train = load_split(train_path)
        task = cls([prompt_fn(q) for q in train["question"]], list(train["target"]), tokenizer)
        if test_path is not None and eval_problems:
            test = load_split(test_path).head(eval_problems)
            task.eval_prompts = [prompt_fn(q) for q in test["question"]]
            task.eval_targets = list(test["target"])
        return task

    def reward(self, output: list[int], target: str) -> float:
        from ratchet.data.reward import reward

        return reward(self.tokenizer.decode(output), target)


def make_prompt_fn(tokenizer, data_source: str):
    from ratchet.data.prompts import make_prompt_fn as data_prompt_fn

    return data_prompt_fn(tokenizer, data_source)


# ---------------------------------------------------------------------------- the batch
@dataclass
class Batch:
    """The answers of one step, flattened group by group; `keep` marks the trained ones."""
    prompts: list[list[int]]
    responses: list[list[int]]
    engine_logprobs: list[list[float]]
    versions: list[list[int]]
    rewards: np.ndarray  # [B]
    advantages: np.ndarray  # [B]
    keep: np.ndarray  # [B] bool
    finish_reasons: list[str]
    group_index: np.ndarray  # [B] stream index of each answer's group
    # the trainer's forward values from the engine's kernels (GRPOConfig.exact_forward)
    exact_logprobs: list[list[float]] | None = None

    def kept(self, name: str):
        values = getattr(self, name)
        return [v for v, k in zip(values, self.keep) if k]


def make_batch(groups: list[Group], task: Task, cfg: GRPOConfig) -> Batch:
    reqs = [r for g in groups for r in g.requests]
    rewards = torch.tensor([[task.reward(r.output, task.targets[g.problem]) for r in g.requests]
                            for g in groups], dtype=torch.float64)  # [n_groups, G]
    advantages = L.group_advantages(rewards, cfg.advantage)
    keep = (L.informative_groups(rewards) if cfg.skip_constant_groups
            else torch.ones(len(groups), dtype=torch.bool))
    keep = keep[:, None].expand_as(rewards)
    return Batch(prompts=[r.prompt for r in reqs], responses=[list(r.output) for r in reqs],
                 engine_logprobs=[list(r.logprobs) for r in reqs],
                 versions=[v for g in groups for v in g.versions],
                 rewards=rewards.flatten().numpy(), advantages=advantages.flatten().numpy(),
                 keep=keep.flatten().numpy() & np.array([len(r.output) > 0 for r in reqs], bool),
                 finish_reasons=[r.finish_reason for r in reqs],
                 group_index=np.repeat([g.index for g in groups], cfg.group_size))


# ---------------------------------------------------------------------------- workers
class Comm:
    """The collectives the loops need; a no-op for one worker."""

    def __init__(self, rank: int = 0, world: int = 1, group=None, device="cpu"):
        self.rank, self.world, self.group = rank, world, group
        self.device = torch.device(device)  # where collective tensors live (cuda for NCCL)

    def sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, group=self.group)
        return t.cpu().tolist()

    def max(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return float(t.cpu())

    def cat(self, x: np.ndarray) -> np.ndarray:
        """Every worker's 1-D float64 array, concatenated in rank order."""
        if self.world == 1:
            return x
        parts = self._all_gather_padded(torch.from_numpy(np.asarray(x, np.float64)))
        return np.concatenate([p.numpy() for p in parts])

    def _all_gather_padded(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every worker's 1-D tensor (lengths may differ), on the CPU, in rank order."""
        dev = self.device
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(self.world)]
        torch.distributed.all_gather(sizes, torch.tensor([len(x)], device=dev), group=self.group)
        n = max(int(s) for s in sizes)
        padded = torch.zeros(n, dtype=x.dtype, device=dev)
        padded[:len(x)] = x.to(dev)
        parts = [torch.zeros(n, dtype=x.dtype, device=dev) for _ in range(self.world)]
        torch.distributed.all_gather(parts, padded, group=self.group)
        return [p[:int(s)].cpu() for p, s in zip(parts, sizes)]

    def digest(self, h: bytes) -> str:
        """One SHA-256 over every worker's digest, in rank order."""
        if self.world == 1:
            return h.hex()
        parts = self._all_gather_padded(torch.frombuffer(bytearray(h), dtype=torch.uint8))
        return hashlib.sha256(b"".join(bytes(p.numpy()) for p in parts)).hexdigest()

    def gather_json(self, obj) -> list:
        """Every worker's JSON-able object, in rank order (no pickle)."""
        import json

        if self.world == 1:
            return [obj]
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        parts = self._all_gather_padded(data)
        return [json.loads(bytes(p.numpy()).decode()) for p in parts]

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        if self.world == 1:
            return
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)  # one collective, not one per tensor
        torch.distributed.all_reduce(flat, group=self.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


# ---------------------------------------------------------------------------- one update
def _pad(rows: list[list[float]], width: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=dtype)
    return out.to(device)


def _micro_batches(rows, prompts, responses, size: int) -> list[list[int]]:
    """`rows` cut into micro-batches of `size`, shortest answers (prompt + response) first:
    a micro-batch is padded to its longest answer, so like goes with like. For the study's
    answers (up to 384 tokens, ~250 on average) that is ~1.06 padded tokens per real one
    instead of ~1.4 in arrival order. The loss is a sum over tokens, so the order changes
    only the order of the gradient's additions."""
    rows = sorted(rows, key=lambda i: len(prompts[i]) + len(responses[i]))  # stable: ties keep order
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def make_optimizer(policy: torch.nn.Module, cfg: GRPOConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(policy.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps,
                             weight_decay=cfg.weight_decay, foreach=False)


@dataclass
class Scored:
    """The kept answers as [n, T] tensors, scored by the trainer before the update."""
    prompts: list[list[int]]
    responses: list[list[int]]
    mask: torch.Tensor  # [n, T] bool, real tokens
    engine: torch.Tensor  # [n, T] the engine's sampling-time log-probs
    trainer: torch.Tensor  # [n, T] the trainer's, before the update
    entropy: torch.Tensor  # [n, T]
    stale: torch.Tensor  # [n, T] bool, drawn by older weights than the trainer's
    advantages: torch.Tensor  # [n]
    exact: torch.Tensor | None = None  # [n, T] the forward's values, when the engine computes them

    def forward_values(self, lp: torch.Tensor, rows) -> torch.Tensor:
        """The trainer's log-probs of `rows` ([b, t], with gradient) as the loss sees them:
        unchanged, or with `exact` the engine's values and lp's gradient (straight through)."""
        if self.exact is None:
            return lp
        exact = self.exact[rows, :lp.shape[1]]
        return exact + (lp - lp.detach())  # the value is exact's bit for bit (lp - lp is 0)


def unscored(batch: Batch, version: int, device) -> Scored:
    """The kept answers as tensors, with the trainer's log-probs and entropy still zero (the
    scoring forward fills them in)."""
    prompts, responses = batch.kept("prompts"), batch.kept("responses")
    n, width = len(responses), max((len(r) for r in responses), default=0)
    lengths = torch.tensor([len(r) for r in responses], dtype=torch.int64)
    return Scored(prompts, responses, (torch.arange(width)[None, :] < lengths[:, None]).to(device),
                  engine=_pad(batch.kept("engine_logprobs"), width, device=device),
                  trainer=torch.zeros(n, width, device=device), entropy=torch.zeros(n, width, device=device),
                  stale=_pad(batch.kept("versions"), width, torch.int64, device) < version,
                  advantages=torch.tensor(batch.advantages[batch.keep], dtype=torch.float32, device=device),
                  exact=None if batch.exact_logprobs is None else
                  _pad(batch.kept("exact_logprobs"), width, device=device))


def score(policy, batch: Batch, cfg: GRPOConfig, version: int) -> Scored:
    """The trainer's log-probs (and entropy) of the sampled tokens, no gradient."""
    sc = unscored(batch, version, next(policy.parameters()).device)
    prompts, responses = sc.prompts, sc.responses
    with torch.no_grad():
        for rows in _micro_batches(range(len(responses)), prompts, responses, cfg.micro_batch_size):
            lp, _, ent = policy.token_logprobs([prompts[i] for i in rows], [responses[i] for i in rows],
                                               temperature=cfg.temperature, weight_dtype=cfg.weight_dtype,
                                               compute_dtype=cfg.compute_dtype, with_entropy=True)
            lp = sc.forward_values(lp, rows)
            sc.trainer[rows, :lp.shape[1]] = lp
            sc.entropy[rows, :lp.shape[1]] = ent
    return sc


def old_logprobs_and_weights(sc: Scored, cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    return _old_and_weights(sc.mask, sc.stale, sc.trainer, sc.engine, cfg)


def _old_and_weights(mask, stale, trainer, engine, cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The ratio's denominator per token, and the correction weight per token. Fresh tokens
    take the trainer's log-probs (old_logprobs "trainer") and the TIS/MIS weight; the others
    take the engine's and weight 1 (their ratio already is the importance ratio)."""
    from_trainer = mask & ~stale if cfg.old_logprobs == "trainer" else torch.zeros_like(mask)
    old = torch.where(from_trainer, trainer, engine)  # [n, T]
    weights = L.correction_weights(cfg.is_correction, trainer, engine, from_trainer,
                                   cfg.is_level, cfg.tis_cap, cfg.mis_low, cfg.mis_high)
    return old, weights + (mask & ~from_trainer).float()


def update(policy, optimizer, sc: Scored, old: torch.Tensor, weights: torch.Tensor,
           cfg: GRPOConfig, comm: Comm) -> dict[str, float]:
    """Mini-batches of answers, each one AdamW step over its micro-batches; the loss of a
    mini-batch is its token sum divided by its token count over all workers."""
    params = list(policy.parameters())
    totals = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "grad_norm": 0.0, "updates": 0}
    minibatches = np.array_split(np.arange(len(sc.responses)), cfg.num_minibatches)
    for minibatch in minibatches:
        num_tokens = comm.sum([float(sc.mask[minibatch].sum())])[0]
        if num_tokens == 0:
            continue  # every worker sees the same global count, so all skip together
        optimizer.zero_grad(set_to_none=False)
        for rows in _micro_batches(minibatch.tolist(), sc.prompts, sc.responses, cfg.micro_batch_size):
            lp, m, _ = policy.token_logprobs([sc.prompts[i] for i in rows], [sc.responses[i] for i in rows],
                                             temperature=cfg.temperature, weight_dtype=cfg.weight_dtype,
                                             compute_dtype=cfg.compute_dtype)  # [b, t]
            lp = sc.forward_values(lp, rows)
            t = lp.shape[1]
            loss, sums = L.policy_loss(lp, old[rows, :t], sc.advantages[rows], m, weights[rows, :t],
                                       num_tokens, cfg.clip_eps_low, cfg.clip_eps_high)
            loss.backward()
            totals["loss"] += float(loss.detach()) / len(minibatches)
            totals["clipped"] += sums["clipped"]
            totals["ratio"] += sums["ratio"]
        comm.sum_grads(params)
        totals["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=False))
        optimizer.step()
        totals["updates"] += 1
    return totals


def score_and_update(policy, optimizer, batch: Batch, cfg: GRPOConfig, version: int,
                     comm: Comm) -> tuple[Scored, torch.Tensor, dict]:
    """`score` then `update` for one mini-batch, in one pass: the weights change only at the
    optimiser step after every micro-batch's backward, so each micro-batch's own forward
    gives the trainer's log-probs before the update (detached, they are `score`'s). This
    drops the scoring forward, a third of the trainer's time; the loss and gradient are the
    same. Returns (the scored batch, the correction weights, the update's totals)."""
    sc = unscored(batch, version, next(policy.parameters()).device)
    prompts, responses = sc.prompts, sc.responses
    n = len(responses)
    weights = torch.zeros_like(sc.trainer)
    params = list(policy.parameters())
    totals = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "grad_norm": 0.0, "updates": 0}
    num_tokens = comm.sum([float(sc.mask.sum())])[0]
    if num_tokens == 0:
        return sc, weights, totals  # every worker sees the same global count, so all skip together
    optimizer.zero_grad(set_to_none=False)
    for rows in _micro_batches(range(n), prompts, responses, cfg.micro_batch_size):
        lp, m, ent = policy.token_logprobs([prompts[i] for i in rows], [responses[i] for i in rows],
                                           temperature=cfg.temperature,
                                           weight_dtype=cfg.weight_dtype, compute_dtype=cfg.compute_dtype,
                                           with_entropy=True)  # [b, t]
        lp = sc.forward_values(lp, rows)
        t = lp.shape[1]
        before = lp.detach()
        sc.trainer[rows, :t], sc.entropy[rows, :t] = before, ent.detach()
        old, w = _old_and_weights(m, sc.stale[rows, :t], before, sc.engine[rows, :t], cfg)
        weights[rows, :t] = w
        loss, sums = L.policy_loss(lp, old, sc.advantages[rows], m, w, num_tokens,
                                   cfg.clip_eps_low, cfg.clip_eps_high)
        loss.backward()
        totals["loss"] += float(loss.detach())
        totals["clipped"] += sums["clipped"]
        totals["ratio"] += sums["ratio"]
    comm.sum_grads(params)
    totals["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=False))
    optimizer.step()
    totals["updates"] = 1
    return sc, weights, totals


def train_on_batch(policy, optimizer, batch: Batch, cfg: GRPOConfig, version: int,
                   comm: Comm | None = None) -> dict[str, float]:
    """One GRPO update on the kept answers of `batch`; `version` is the number of updates
    the trainer's weights have seen (tokens sampled under an older version are stale).
    Returns the step's metrics, over all workers."""
    comm = comm or Comm()
    if cfg.num_minibatches == 1:
        sc, weights, totals = score_and_update(policy, optimizer, batch, cfg, version, comm)
    else:
        sc = score(policy, batch, cfg, version)
        old, weights = old_logprobs_and_weights(sc, cfg)
        totals = update(policy, optimizer, sc, old, weights, cfg, comm)
    return step_metrics(batch, sc, weights, totals, cfg, comm)


def step_metrics(batch: Batch, sc: Scored, weights: torch.Tensor, totals: dict, cfg: GRPOConfig,
                 comm: Comm) -> dict[str, float]:
    mask = sc.mask
    lengths = np.array([len(r) for r in batch.responses], dtype=np.float64)
    local = {"loss": totals["loss"], "clipped": totals["clipped"], "ratio": totals["ratio"],
             "grad_norm": totals["grad_norm"], "tokens": float(mask.sum()),
             "entropy": float(sc.entropy[mask].sum()), "seqs": float(len(sc.responses)),
             "answers": float(len(batch.rewards)), "reward": float(batch.rewards.sum()),
             "correct": float((batch.rewards >= 1).sum()), "length": float(lengths.sum()),
             "truncated": float(sum(f == "length" for f in batch.finish_reasons)),
             "groups": float(len(set(batch.group_index.tolist()))),
             "kept_groups": float(len(set(batch.group_index[batch.keep].tolist()))),
             "stale": float((sc.stale & mask).sum()), "weight": float(weights[mask].sum()),
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
        "train/num_tokens": s["tokens"],
        "train/num_sequences": s["seqs"],
        "train/reward": s["reward"] / s["answers"],
        "train/accuracy": s["correct"] / s["answers"],
        "train/response_length_mean": s["length"] / s["answers"],
        "train/response_length_max": comm.max(float(lengths.max(initial=0))),
        "train/truncated_share": s["truncated"] / s["answers"],
        "train/groups_skipped_share": 1.0 - s["kept_groups"] / max(s["groups"], 1.0),
        "train/is_weight_mean": s["weight"] / tokens,
        "train/is_masked_share": s["masked"] / tokens,
        "rollout/stale_token_share": s["stale"] / tokens,
    }
    # the mismatch on the trained tokens: engine (sampling time) against trainer (before the update)
    e_all = comm.cat(sc.engine[mask].double().cpu().numpy())
    t_all = comm.cat(sc.trainer[mask].double().cpu().numpy())
    if len(e_all):
        out.update(gap_metrics(e_all, t_all, eps=max(cfg.clip_eps_low, cfg.clip_eps_high)))
        ratio = np.exp(t_all - e_all)
        out.update({"sampling/importance_sampling_ratio/min": float(ratio.min()),
                    "sampling/importance_sampling_ratio/mean": float(ratio.mean()),
                    "sampling/importance_sampling_ratio/max": float(ratio.max())})
    return out


# ---------------------------------------------------------------------------- reproducibility
def set_determinism(seed: int) -> None:
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS on GPU
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


def batch_digests(batch: Batch, comm: Comm) -> dict[str, str]:
    """SHA-256 of the step's rollout tokens and engine log-probs (all answers, in order)."""
    tokens = hashlib.sha256()
    logprobs = hashlib.sha256()
    for prompt, response, lp in zip(batch.prompts, batch.responses, batch.engine_logprobs):
        tokens.update(np.asarray([len(prompt), len(response), *prompt, *response], np.int64).tobytes())
        logprobs.update(np.asarray(lp, np.float32).tobytes())
    return {"tokens": comm.digest(tokens.digest()), "logprobs": comm.digest(logprobs.digest())}


def trace_row(step: int, digests: dict, loss: float, policy, cfg: GRPOConfig) -> dict:
    """One step of the run's trace. The weights' SHA-256 costs a device-to-host copy of the
    model, so for a large model it is taken only where it is compared: the steps `verify`
    reruns, checkpoint steps and the last step ("" elsewhere)."""
    small = sum(p.numel() for p in policy.parameters()) < SMALL_MODEL_PARAMS
    wanted = (small or step < cfg.verify_steps or (step + 1) % cfg.checkpoint_every == 0
              or step + 1 == cfg.steps)
    return {"step": step, "tokens": digests["tokens"], "logprobs": digests["logprobs"],
            "loss": float_hex(loss), "weights": weights_digest(policy) if wanted else ""}


def weights_digest(policy) -> str:
    """SHA-256 of the fp32 masters in the engine layout order."""
    h = hashlib.sha256()
    for name, w in policy.export_weights().items():
        h.update(name.encode())
        h.update(w.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def float_hex(x: float) -> str:
    """A float written exactly (for comparing losses bit for bit)."""
    return float(x).hex()


class Timer:
    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        t, self.t0 = self.t0, time.perf_counter()
        return self.t0 - t


def write_parquet(rows: list[dict], path: Path) -> None:
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    tmp.replace(path)


# ---------------------------------------------------------------------------- a training job
@dataclass
class Job:
    """Everything a training process needs, as plain data (JSON for child processes)."""
    grpo: GRPOConfig
    model_dir: str
    train_path: str
    data_source: str
    out_dir: str
    test_path: str | None = None
    backend: str = "numpy"
    max_batch_size: int = 64
    max_seq_len: int = 1024
    eval_max_new_tokens: int = 8
    device: str = "cpu"  # the trainer's torch device ("cuda" on a GPU machine)
    digest: str = ""  # of the settings; a checkpoint under another digest is never resumed
    resume: bool = True
    checkpoints: bool = True
    save_model: bool = True

    def to_json(self) -> str:
        import dataclasses
        import json

        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Job":
        import json

        d = json.loads(text)
        return cls(**{**d, "grpo": GRPOConfig(**d["grpo"])})

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.out_dir) / "checkpoints"

    def load_task(self) -> Task:
        return Task.load(self.model_dir, self.train_path, self.data_source, self.test_path,
                         self.grpo.eval_problems if self.grpo.eval_every else 0)


class Evaluator:
    """Greedy accuracy on the first `eval_problems` test problems, with an idle engine (the
    colocated worker's own, or one built on first use in the split trainer)."""

    def __init__(self, job: Job, task: Task):
        self.job, self.task, self.engine = job, task, None

    def due(self, step: int) -> bool:
        every = self.job.grpo.eval_every
        return bool(every and self.task.eval_prompts and (step % every == 0 or step == self.job.grpo.steps))

    def __call__(self, policy, engine=None) -> dict[str, float]:
        from ratchet.engine.request import Request

        start = time.perf_counter()
        if engine is None:
            engine = self._own_engine(policy)
        reqs = [Request(request_id=i, prompt=list(p), max_new_tokens=self.job.eval_max_new_tokens,
                        greedy=True, temperature=1.0) for i, p in enumerate(self.task.eval_prompts)]
        done = engine.generate(reqs)
        correct = [self.task.reward(r.output, t) for r, t in zip(done, self.task.eval_targets)]
        return {"eval/accuracy": float(np.mean(correct)), "time/eval_s": time.perf_counter() - start}

    def _own_engine(self, policy):
        from ratchet.engine.engine import Engine
        from ratchet.model.io import EngineModel
        from ratchet.rl.sync import engine_weights, sync_weights

        if self.engine is None:
            model = EngineModel(policy.cfg, engine_weights(policy), self.job.grpo.engine_dtype)
            self.engine = Engine(model, backend=self.job.backend, max_batch_size=self.job.max_batch_size,
                                 max_seq_len=self.job.max_seq_len)
        else:  # on the GPU, no host round trip of the masters
            sync_weights(self.engine, policy)
        return self.engine


def load_start(job: Job, device: str = "cpu"):
    """(EngineModel, Policy on `device`, AdamW) from the converted model, as a run starts."""
    from ratchet.model.io import load_engine_model
    from ratchet.trainer.policy import Policy

    model = load_engine_model(job.model_dir)
    policy = Policy.from_weights(model.cfg, model.weights, device=device)
    return model, policy, make_optimizer(policy, job.grpo)


def worker_device(job: Job, rank: int, world: int) -> tuple[str, str]:
    """(torch device of this worker's trainer, torch.distributed backend): NCCL when every
    worker has a GPU of its own, else gloo (CPU tensors)."""
    if job.device == "cpu":
        return "cpu", "gloo"
    if torch.cuda.device_count() >= world:
        torch.cuda.set_device(rank)
        if job.backend == "cuda":  # the engine (CuPy) on the same GPU as this worker's trainer
            import cupy

            cupy.cuda.Device(rank).use()
        return f"cuda:{rank}", "nccl"
    return "cuda", "gloo"


def find_resume(job: Job):
    """The checkpoint to resume from, or None; removes half-written ones."""
    from ratchet.rl import checkpoint as C

    if not (job.resume and job.checkpoints):
        return None
    C.clean_temporaries(job.checkpoint_dir)
    return C.latest_checkpoint(job.checkpoint_dir, job.digest)


def trainer_tensors(policy, optimizer) -> dict[str, dict[str, torch.Tensor]]:
    from ratchet.rl import checkpoint as C

    return {"policy": {k: v.clone() for k, v in policy.export_weights().items()},
            "optimizer": C.optimizer_tensors(optimizer, policy), "rng": C.rng_tensors()}


def restore_trainer(policy, optimizer, tensors: dict) -> None:
    from ratchet.rl import checkpoint as C

    policy.load_weights({k: v for k, v in tensors["policy"].items()})  # copies onto its device
    C.load_optimizer(optimizer, policy, tensors["optimizer"])
    C.load_rng(tensors["rng"])


def relog(rows: list[dict], log) -> None:
    """A resumed run's tracker gets the steps before the checkpoint again, so its history is whole."""
    if log is not None:
        for row in rows:
            log({k: v for k, v in row.items() if k != "step"}, row["step"])


def write_outputs(job: Job, policy, model_cfg, rows: list[dict], trace: list[dict],
                  extra: dict | None = None) -> dict:
    """metrics.parquet, trace.parquet, model/ (engine dtype, with its manifest), summary.json."""
    import json
    import os

    from ratchet.model.io import save_engine_model
    from ratchet.rl.sync import engine_weights

    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(rows, out / "metrics.parquet")
    write_parquet(trace, out / "trace.parquet")
    trained = [r for r in rows if "train/loss" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    summary = {"steps": job.grpo.steps, "weights_sha256": weights_digest(policy),
               "last_step": trained[-1] if trained else None,
               "eval_accuracy": [[r["step"], r["eval/accuracy"]] for r in evals],
               "train_s": float(sum(r.get("time/step_s", 0.0) for r in trained)),
               **(extra or {})}
    if job.save_model:
        model_dir = save_engine_model(out / "model", model_cfg, engine_weights(policy),
                                      job.grpo.engine_dtype, tokenizer_dir=job.model_dir)
        summary["model_sha256"] = json.loads((model_dir / "manifest.json").read_text())["file_sha256"]
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out / "summary.json")
    return summary


# ---------------------------------------------------------------------------- processes
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(rank: int, world: int, port: int, backend: str = "gloo") -> None:
    from datetime import timedelta

    torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world, timeout=timedelta(minutes=30))


SMALL_MODEL_PARAMS = 50_000_000  # below this one torch thread beats several (start-up, spinning)


def configure_threads(model_cfg, num_processes: int = 1) -> None:
    """One torch thread for a small model; else this process' share of the cores. (A fixed
    choice per setting: the thread count can change float sums, so reruns must agree.)"""
    import os

    from ratchet.model.layout import num_parameters

    if num_parameters(model_cfg) < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // num_processes))


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a killed trainer takes its workers)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Workers:
    """Child processes `python -m <module> --rank r ...` (the job goes as a JSON file), watched:
    if one dies with an error while this process waits on it in a collective, this process
    exits too instead of hanging until the process group's timeout."""

    def __init__(self, module: str, job: Job, ranks: range, world: int, port: int,
                 env: dict[str, str] | None = None):
        import os
        import subprocess
        import sys
        import threading

        self.job_file = Path(job.out_dir) / f".job-{port}.json"
        self.job_file.parent.mkdir(parents=True, exist_ok=True)
        self.job_file.write_text(job.to_json())
        self.procs = [subprocess.Popen([sys.executable, "-m", module, "--job", str(self.job_file),
                                        "--rank", str(r), "--world", str(world), "--port", str(port)],
                                       env={**os.environ, **(env or {})})
                      for r in ranks]
        self.closing = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        import os
        import sys

        while not self.closing.wait(0.5):
            for p in self.procs:
                code = p.poll()
                if code not in (None, 0) and not self.closing.is_set():
                    print(f"worker {p.args[2:]} died with exit code {code}; stopping", file=sys.stderr,
                          flush=True)
                    os._exit(1)

    def close(self, failed: bool) -> None:
        self.closing.set()
        for p in self.procs:
            if failed:
                p.kill()
            code = p.wait()
            if code != 0 and not failed:
                raise RuntimeError(f"worker {p.args[2:]} exited with code {code}")
        self.job_file.unlink(missing_ok=True)


def worker_main(run_worker) -> None:
    """Entry point of a spawned worker: `run_worker(job, rank, world, port)`."""
    import argparse

    die_with_parent()
    parser = argparse.ArgumentParser()
    for name in ("--job", "--rank", "--world", "--port"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    job = Job.from_json(Path(args.job).read_text())
    run_worker(job, int(args.rank), int(args.world), int(args.port))


def send_json(obj, dst: int) -> None:
    import json

    payload = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    torch.distributed.send(torch.tensor([payload.numel()], dtype=torch.int64), dst)
    torch.distributed.send(payload, dst)


def recv_json(src: int):
    import json

    size = torch.zeros(1, dtype=torch.int64)
    torch.distributed.recv(size, src)
    payload = torch.empty(int(size), dtype=torch.uint8)
    torch.distributed.recv(payload, src)
    return json.loads(bytes(payload.numpy()).decode())
