"""GRPO runs for the ablations, and the fix compared with importance-sampling corrections.

    setup = Setup(model, task, measure_prompts, backend="numpy")
    run = Trajectory(setup, settings.grpo("none"))   # an engine samples, AdamW updates fp32 masters
    run.advance_to(updates=3)                        # then the engine is synced (rounded) again
    steps, runs = fix_runs(setup, settings)          # none / fix / TIS / MIS from the same seeds

Every run here is the colocated loop of `ratchet/rl/colocated.py` cut to what the ablations
need: roll out with the engine, one GRPO update (`train_on_batch`), copy the masters into the
engine (rounded to its dtype at the copy). A step whose groups all scored the same trains on
nothing and is not an update, so the decomposition counts real updates, not steps.

The runs of `fix_runs` differ in one knob each, everything else (seeds, data order,
sampling noise) is shared:
- `none`: the trainer's forward on its fp32 masters, no correction.
- `fix`:  the forward on the masters rounded to the engine dtype (straight-through gradient to
  the fp32 masters), i.e. `token_logprobs(weight_dtype=<engine dtype>)`. What it leaves is
  the engine's own arithmetic (fp16 activations, its kernels' summation orders).
- `exact`: `fix`, with the forward's values computed by the engine's kernels on those same
  rounded weights (teacher forcing, ratchet/engine/score.py) and the gradient from the fix's
  torch forward (straight through). With a batch-invariant engine the replay reproduces the
  rollout's bits, in the trainer's own grouping of the answers.
- `tis`:  truncated importance sampling, loss weight min(pi_trainer / pi_engine, tis_cap).
- `mis`:  masked importance sampling, tokens whose ratio leaves [mis_low, mis_high] dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

FIX_RUNS = ("none", "fix", "exact", "tis", "mis")
# the gap metrics a row keeps, under short names (engine vs the trainer, per token)
GAP_COLUMNS = {
    "mismatch/logprob_abs_diff_mean": "gap_mean",
    "mismatch/logprob_abs_diff_p99": "gap_p99",
    "mismatch/logprob_abs_diff_max": "gap_max",
    "mismatch/ratio_outside_share": "ratio_outside_share",
    "mismatch/kl_k3": "kl_k3",
}


@dataclass
class AblateSettings:
    """The `ablate:` config section (see ratchet/schemas/config.schema.yaml)."""
    updates: tuple[int, ...] = (0, 1, 3, 10, 30)
    num_rollouts: int = 64
    max_new_tokens: int = 8
    problems_per_step: int = 8
    group_size: int = 8
    lr: float = 1e-6
    eps: float = 0.2
    temperature: float = 1.0
    engine_dtypes: tuple[str, ...] = ("fp16", "bf16")
    visibility_updates: int = 30
    fix_steps: int = 30
    fix_runs: tuple[str, ...] = FIX_RUNS
    tis_cap: float = 2.0
    mis_low: float = 0.5
    mis_high: float = 2.0
    micro_batch_size: int = 16
    max_steps_per_update: int = 20
    eval_problems: int | None = None
    batch_invariant: bool = True  # the ablations' engines (see Setup.batch_invariant)
    seed: int = 0
    engine_dtype: str = "fp16"  # the pipeline's engine: samples the training rollouts

    def __post_init__(self):
        self.updates = tuple(sorted(set(int(u) for u in self.updates)))
        self.engine_dtypes = tuple(self.engine_dtypes)
        self.fix_runs = tuple(self.fix_runs)
        unknown = set(self.fix_runs) - set(FIX_RUNS)
        if unknown:
            raise ValueError(f"config ablate.fix_runs: {sorted(unknown)} not in {FIX_RUNS}")
        if not self.updates or self.updates[0] < 0:
            raise ValueError("config ablate.updates: needs update counts >= 0")

    @classmethod
    def from_config(cls, cfg: dict) -> "AblateSettings":
        a = dict(cfg["ablate"])
        return cls(**a, seed=cfg["seed"], engine_dtype=cfg["engine"]["dtype"])

    def grpo(self, run: str = "none", steps: int | None = None):
        """The GRPOConfig of one ablation run ("none", "fix", "tis" or "mis")."""
        from ratchet.rl.grpo import GRPOConfig

        return GRPOConfig(steps=steps or self.fix_steps, problems_per_step=self.problems_per_step,
                          group_size=self.group_size, max_new_tokens=self.max_new_tokens,
                          temperature=self.temperature, lr=self.lr, clip_eps_low=self.eps,
                          clip_eps_high=self.eps, is_correction=run if run in ("tis", "mis") else "none",
                          tis_cap=self.tis_cap, mis_low=self.mis_low, mis_high=self.mis_high,
                          round_weights=run in ("fix", "exact"), exact_forward=run == "exact",
                          micro_batch_size=self.micro_batch_size,
                          seed=self.seed, engine_dtype=self.engine_dtype)


@dataclass
class Setup:
    """What every ablation run starts from."""
    model: object  # EngineModel: the converted weights (on the engine dtype's grid)
    task: object  # ratchet.rl.grpo.Task: training prompts, targets, reward
    measure_prompts: list[list[int]]  # prompts of the fresh rollouts the gaps are measured on
    backend: str = "numpy"
    max_batch_size: int = 64
    max_seq_len: int = 1024
    device: str = "cpu"  # the trainer's torch device
    eval_problems: pd.DataFrame | None = None  # test split for the after-training accuracy
    prompt_fn: object = None  # question -> prompt ids (for the eval)
    eval_max_new_tokens: int = 8
    # batch-invariant engines (one CUDA decode bucket, prompts prefilled by decode steps), so
    # that teacher forcing (the exact fix) reproduces a rollout's bits in any grouping
    batch_invariant: bool = True

    def engine(self, dtype: str, weights=None):
        """A fresh engine of `dtype` on `weights` (the converted ones by default), rounded."""
        from ratchet.engine.engine import Engine
        from ratchet.model.dtypes import round_to
        from ratchet.model.io import EngineModel

        weights = self.model.weights if weights is None else weights
        model = EngineModel(self.model.cfg, {k: round_to(v, dtype) for k, v in weights.items()}, dtype)
        return Engine(model, backend=self.backend, max_batch_size=self.max_batch_size,
                      max_seq_len=self.max_seq_len, batch_invariant=self.batch_invariant)


class Trajectory:
    """One GRPO run of the colocated loop: roll out, update the fp32 masters, sync the engine."""

    def __init__(self, setup: Setup, grpo_cfg):
        import torch

        from ratchet.rl.grpo import make_optimizer, set_determinism
        from ratchet.rl.rollout import Rollouts
        from ratchet.trainer.policy import Policy

        self.setup, self.cfg = setup, grpo_cfg
        if setup.device == "cpu":  # CPU kernels are deterministic; the switch costs 3 s of imports
            torch.manual_seed(grpo_cfg.seed)
        else:
            set_determinism(grpo_cfg.seed)
        self.policy = Policy.from_weights(setup.model.cfg, setup.model.weights, device=setup.device)
        self.optimizer = make_optimizer(self.policy, grpo_cfg)
        self.engine = setup.engine(grpo_cfg.engine_dtype)
        self.rollouts = Rollouts(setup.task.prompts, grpo_cfg.group_size, grpo_cfg.max_new_tokens,
                                 grpo_cfg.temperature, grpo_cfg.seed, grpo_cfg.problems_per_step)
        self.step = 0  # rollout + train steps taken
        self.updates = 0  # steps that changed the masters

    def train_step(self) -> dict[str, float]:
        from ratchet.engine.score import teacher_forced_logprobs
        from ratchet.rl.grpo import make_batch, train_on_batch
        from ratchet.rl.sync import sync_weights

        groups, _ = self.rollouts.collect(self.engine, self.step, version=self.step)
        batch = make_batch(groups, self.setup.task, self.cfg)
        if self.cfg.exact_forward:  # the engine holds the rounded masters: the trainer's weights
            kept = np.flatnonzero(batch.keep)  # only the trained answers (others: never read)
            scored = teacher_forced_logprobs(self.engine, [batch.prompts[i] for i in kept],
                                             [batch.responses[i] for i in kept], self.cfg.temperature,
                                             self.cfg.micro_batch_size)
            batch.exact_logprobs = [[] for _ in batch.responses]
            for i, lp in zip(kept, scored):
                batch.exact_logprobs[i] = lp
        metrics = train_on_batch(self.policy, self.optimizer, batch, self.cfg, version=self.step)
        sync_weights(self.engine, self.policy)
        self.step += 1
        self.updates += metrics["train/num_updates"] > 0
        return metrics

    def advance_to(self, updates: int, max_steps_per_update: int = 20) -> None:
        """Train until the masters have seen `updates` updates."""
        budget = self.step + max_steps_per_update * max(updates - self.updates, 0)
        while self.updates < updates:
            if self.step >= budget:
                raise RuntimeError(f"ablation run: {self.updates} updates after {self.step} steps; "
                                   "every group scored the same too often (raise "
                                   "ablate.max_steps_per_update or ablate.group_size)")
            self.train_step()

    def masters(self) -> dict:
        """A copy of the fp32 masters under the engine names, as torch tensors kept on the
        trainer's device (comparing 0.5B weights there is cheap, on the host it is not)."""
        return {k: v.detach().clone() for k, v in self.policy.export_weights().items()}


def fresh_gap(policy, engine, prompts: list[list[int]], max_new_tokens: int, seed: int,
              temperature: float, eps: float, weight_dtype: str = "fp32",
              compute_dtype: str = "fp32", exact_batch_size: int | None = None) -> dict[str, float]:
    """Sync `engine` from the masters, sample one answer per prompt, and measure the gap to
    the trainer variant on those tokens (short column names); with `exact_batch_size`, to the
    engine's own teacher forcing in groups of that many answers (the exact fix)."""
    from ratchet.mismatch.compare import engine_logprobs, exact_logprobs, sample, trainer_logprobs
    from ratchet.mismatch.metrics import gap_metrics
    from ratchet.rl.sync import sync_weights

    sync_weights(engine, policy)
    reqs = sample(engine, prompts, max_new_tokens, seed, temperature)
    if exact_batch_size:
        t = exact_logprobs(engine, reqs, temperature, exact_batch_size)
    else:
        t = trainer_logprobs(policy, reqs, temperature, weight_dtype, compute_dtype)
    return short_gap(gap_metrics(engine_logprobs(reqs), t, eps=eps))


def short_gap(metrics: dict[str, float]) -> dict[str, float]:
    return {short: float(metrics.get(key, np.nan)) for key, short in GAP_COLUMNS.items()}


def fix_runs(setup: Setup, settings: AblateSettings, log=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run each of `settings.fix_runs` for `fix_steps` steps from the same seeds.

    Returns (steps, runs): one row per run and step (the reward, and the gap between the
    engine and the trainer as it computes the loss, on that step's rollouts before the
    update), and one row per run after training (greedy accuracy on the test split, and the
    gap measured on fresh rollouts). `log(run, step, metrics)` is called after every step.
    """
    from ratchet.rl.evaluate import evaluate
    from ratchet.rl.sync import sync_weights

    step_rows, run_rows = [], []
    for name in settings.fix_runs:
        cfg = settings.grpo(name, settings.fix_steps)
        traj = Trajectory(setup, cfg)
        for step in range(settings.fix_steps):
            m = traj.train_step()
            row = {"run": name, "step": step, "updates": traj.updates,
                   "reward": m["train/reward"], "num_tokens": m["train/num_tokens"],
                   "is_weight_mean": m["train/is_weight_mean"],
                   "is_masked_share": m["train/is_masked_share"],
                   "clip_fraction": m["train/clip_fraction"], **short_gap(m)}
            step_rows.append(row)
            if log is not None:
                log(name, step, row)
        final = fresh_gap(traj.policy, traj.engine, setup.measure_prompts, settings.max_new_tokens,
                          settings.seed + 1, settings.temperature, settings.eps,
                          weight_dtype=cfg.weight_dtype, compute_dtype=cfg.compute_dtype,
                          exact_batch_size=cfg.micro_batch_size if cfg.exact_forward else None)
        summary = {"run": name, "steps": settings.fix_steps, "updates": traj.updates,
                   "weight_dtype": cfg.weight_dtype, "is_correction": cfg.is_correction,
                   "exact_forward": cfg.exact_forward}
        if setup.eval_problems is not None:
            sync_weights(traj.engine, traj.policy)
            ev, _ = evaluate(traj.engine, setup.task.tokenizer, setup.eval_problems, setup.prompt_fn,
                             setup.eval_max_new_tokens, progress=False)
            summary.update({"accuracy": ev["accuracy"], "accuracy_stderr": ev["accuracy_stderr"],
                            "eval_n": ev["n"]})
        rewards = [r["reward"] for r in step_rows if r["run"] == name]
        last = rewards[-max(1, len(rewards) // 5):]
        summary["reward_last_fifth"] = float(np.mean(last))
        summary.update({f"final_{k}": v for k, v in final.items()})
        run_rows.append(summary)
    return pd.DataFrame(step_rows), pd.DataFrame(run_rows)
