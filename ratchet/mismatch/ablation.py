"""What the ablations share: their settings, the setup every run starts from, and one GRPO
run of the colocated loop (`Trajectory`), cut to what they measure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

import pandas as pd

from ratchet.config import ConfigError
from ratchet.rl.settings import GRPOConfig, lookup

# the GRPO knobs of each ablation run, over the profile's `train:` settings
FIX_RUNS: dict[str, dict] = {
    "none": {},  # the trainer's forward on its fp32 masters, no correction
    "fix": {"round_weights": True},  # the forward on the masters rounded to the engine dtype
    "exact": {"round_weights": True, "exact_forward": True},  # ... its values the engine's own
    "tis": {"is_correction": "tis"},  # truncated importance sampling
    "mis": {"is_correction": "mis"},  # masked importance sampling
}

ENGINE_DTYPES = ("fp16", "bf16", "fp32")  # an ablation engine's dtypes (the schema's enum)
EVERY = "all"  # without ablate.parallel_jobs: ablate_fix_run's one job, and the gradients' one part
FIX_RUNS_ONLY = "fix_runs"  # ablate.parallel_jobs: a job a fix run, the gradients along ablate_decompose's run


def fix_jobs(ablate: dict) -> list[str]:
    """ablate_fix_run's jobs (remedies, or EVERY) for the `ablate:` section: a job a remedy
    where ablate.parallel_jobs is true or "fix_runs"."""
    return list(ablate["fix_runs"]) if ablate["parallel_jobs"] in (True, FIX_RUNS_ONLY) else [EVERY]


def gradient_parts(ablate: dict) -> list[str]:
    """The gradients' parts: one per engine dtype from ablate_gradient_run's jobs (ablate.parallel_jobs
    true), or EVERY, the one ablate_decompose measures along its own run (no replay) otherwise."""
    return list(ablate["engine_dtypes"]) if ablate["parallel_jobs"] is True else [EVERY]

_OUTSIDE_ABLATE = {"seed": ("seed",), "engine_dtype": ("engine", "dtype"), "train": ("train",)}


@dataclass
class AblateSettings:
    """The `ablate:` section, the seed, the pipeline's engine dtype and the profile's GRPO
    settings (the ablation runs' knobs that `ablate:` does not set)."""
    updates: tuple[int, ...]
    gradient_updates: tuple[int, ...] | None  # None: `updates`
    num_rollouts: int
    max_new_tokens: int
    problems_per_step: int
    group_size: int
    lr: float
    eps: float
    temperature: float
    engine_dtypes: tuple[str, ...]
    visibility_updates: int
    fix_steps: int
    fix_runs: tuple[str, ...]
    tis_cap: float
    mis_low: float
    mis_high: float
    micro_batch_size: int
    micro_batch_tokens: int | None  # None: train.micro_batch_tokens
    gradient_checkpointing: bool | None  # None: train.gradient_checkpointing
    gradients_at_once: int | None  # gradient.batch_rows: SHARING_SETS a pass (None: a forward's all)
    compute_dtype: str  # the runs' trainer arithmetic (ablate.compute_dtype, not train's)
    updates_compute_dtype: str | None  # ablate_decompose's run (None: compute_dtype)
    max_steps_per_update: int
    eval_problems: int | None
    batch_invariant: bool  # the ablations' engines (see Setup.batch_invariant)
    seed: int
    engine_dtype: str  # the pipeline's engine: samples the training rollouts
    train: GRPOConfig

    def __post_init__(self):
        self.updates = tuple(sorted(set(int(u) for u in self.updates)))
        self.engine_dtypes = tuple(self.engine_dtypes)
        self.fix_runs = tuple(self.fix_runs)
        unknown = set(self.fix_runs) - set(FIX_RUNS)
        if unknown:
            raise ConfigError(f"config ablate.fix_runs: {sorted(unknown)} not in {tuple(FIX_RUNS)}")
        if not self.updates or self.updates[0] < 0:
            raise ConfigError("config ablate.updates: needs update counts >= 0")
        if self.gradient_updates is None:
            self.gradient_updates = self.updates
        self.gradient_updates = tuple(sorted(set(int(u) for u in self.gradient_updates)))
        if not self.gradient_updates or self.gradient_updates[0] < 0:
            raise ConfigError(f"config ablate.gradient_updates: needs update counts >= 0, "
                             f"got {list(self.gradient_updates)}")

    @staticmethod
    def schema_key(name: str) -> tuple[str, ...]:
        return _OUTSIDE_ABLATE.get(name, ("ablate", name))

    @classmethod
    def from_config(cls, cfg: dict) -> "AblateSettings":
        """From a validated config (ratchet.config.validate fills every default)."""
        values = {f.name: lookup(cfg, cls.schema_key(f.name)) for f in fields(cls)}
        return cls(**{**values, "train": GRPOConfig.from_config(cfg)})

    def grpo(self, run: str = "none", steps: int | None = None) -> GRPOConfig:
        """The GRPOConfig of one ablation run (a key of FIX_RUNS)."""
        ablate = dict(steps=steps or self.fix_steps, problems_per_step=self.problems_per_step,
                      group_size=self.group_size, max_new_tokens=self.max_new_tokens,
                      temperature=self.temperature, lr=self.lr, clip_eps_low=self.eps,
                      clip_eps_high=self.eps, tis_cap=self.tis_cap, mis_low=self.mis_low,
                      mis_high=self.mis_high, micro_batch_size=self.micro_batch_size,
                      micro_batch_tokens=self.micro_batch_tokens or self.train.micro_batch_tokens,
                      gradient_checkpointing=(self.train.gradient_checkpointing if self.gradient_checkpointing is None
                                              else self.gradient_checkpointing),
                      compute_dtype=self.compute_dtype, seed=self.seed, engine_dtype=self.engine_dtype,
                      is_correction="none", round_weights=False, exact_forward=False)
        return dataclasses.replace(self.train, **{**ablate, **FIX_RUNS[run]})


@dataclass
class Setup:
    """What every ablation run starts from."""
    model: object  # EngineModel: the converted weights (on the engine dtype's grid)
    task: object  # ratchet.rl.task.Task: training prompts, targets, reward
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
    vllm_options: dict | None = None  # the `engine.vllm` section (backend vllm)
    # the converted weights rounded to each dtype, made once, for the engines that do not start on
    # a trainer's GPU masters (`engine`'s `masters`: NumPy, vLLM, a CPU trainer): rounding 0.5B
    # weights on the host takes seconds (engines copy what they load)
    rounded: dict = field(default_factory=dict, repr=False, compare=False)

    def engine(self, dtype: str, weights=None, backend: str | None = None, batch_invariant: bool | None = None,
               masters=None):
        """A fresh engine of `dtype` on `weights` (the converted ones by default), rounded, on
        `backend` (the setup's by default; vLLM has no batch-invariant mode), with the setup's
        rows and, unless given, its batch invariance. `masters` (a Policy): the trainer this
        engine is synced from before its first use, or whose masters still are the converted
        weights. A CUDA engine then starts on them where they are on a GPU, rounded there as a
        sync rounds them (bit for bit round_to), instead of on weights rounded and uploaded from
        the host (~3 GB at 1.5B, most of the ~1.3 s an engine made again took): either start
        holds the same bits by the time it is used."""
        from ratchet.engines import make_engine
        from ratchet.model.dtypes import round_to
        from ratchet.model.io import EngineModel
        from ratchet.rl.sync import device_masters

        backend = backend or self.backend
        invariant = self.batch_invariant if batch_invariant is None else batch_invariant
        on_gpu = device_masters(masters) if masters is not None and weights is None and backend == "cuda" else None
        if on_gpu is not None:
            values, device = on_gpu
        elif weights is not None:
            values, device = {k: round_to(v, dtype) for k, v in weights.items()}, None
        else:
            if dtype not in self.rounded:
                self.rounded[dtype] = {k: round_to(v, dtype) for k, v in self.model.weights.items()}
            values, device = self.rounded[dtype], None
        model = EngineModel(self.model.cfg, values, dtype)
        return make_engine(model, backend=backend, max_batch_size=self.max_batch_size,
                           max_seq_len=self.max_seq_len, batch_invariant=invariant and backend != "vllm",
                           device=device, vllm_options=self.vllm_options)

    def eval_engine(self, dtype: str, masters=None):
        """The engine a run's greedy evals use, or None for the trajectory's own. A batch-invariant
        CUDA engine runs every step at its one bucket and prefills by decode steps, which is
        right for the rollouts a replay must reproduce and far too slow for an eval of every
        test problem; greedy answers need no replay, so on CUDA they run on the product's
        engine (every bucket, packed prefill), synced from the same masters before each eval.
        It has the trajectory engine's rows: a CUDA engine's answers depend on how many requests
        share a step, so every remedy is scored on an engine of one shape (with more rows the
        exact fix's evals once disagreed with the others' on problems neither's weights
        explained). The NumPy engine is batch-invariant at full speed and vLLM has no such
        mode: both evaluate on the trajectory's engine."""
        if self.backend != "cuda" or not self.batch_invariant:
            return None
        return self.engine(dtype, batch_invariant=False, masters=masters)

    def for_run(self, grpo_cfg: GRPOConfig) -> Setup:
        """The setup a training run (ablate_fix, ablate_learning) starts from, on the engine
        `train` gives its remedy: batch-invariant only for the exact fix, whose values are the
        engine's replay of its rollouts; the others sample on the product's fast engine."""
        return dataclasses.replace(self, batch_invariant=self.batch_invariant and grpo_cfg.exact_forward)


def greedy_eval(setup: Setup, traj: Trajectory, eval_engine=None) -> tuple[dict, pd.DataFrame]:
    """(summary, answers) of greedy answers to `setup.eval_problems` from the trajectory's
    masters, synced first into `eval_engine` (`Setup.eval_engine`) where there is one, else
    into the trajectory's engine."""
    from ratchet.rl.evaluate import evaluate
    from ratchet.rl.sync import sync_weights

    engine = traj.engine if eval_engine is None else eval_engine
    sync_weights(engine, traj.policy)
    return evaluate(engine, setup.task.tokenizer, setup.eval_problems, setup.prompt_fn,
                    setup.eval_max_new_tokens, progress=False)


class Trajectory:
    """One GRPO run of the colocated loop: roll out, update the fp32 masters, sync the engine.
    A step whose groups all scored the same trains on nothing and is not an update."""

    def __init__(self, setup: Setup, grpo_cfg: GRPOConfig):
        import torch

        from ratchet.rl.rollout import Rollouts
        from ratchet.rl.runtime import set_determinism
        from ratchet.rl.telemetry import SyncTelemetry
        from ratchet.rl.update import make_optimizer
        from ratchet.trainer.policy import Policy

        self.setup, self.cfg = setup, grpo_cfg
        if setup.device == "cpu":  # CPU kernels are deterministic; the switch costs 3 s of imports
            torch.manual_seed(grpo_cfg.seed)
        else:
            set_determinism(grpo_cfg.seed)
        self.policy = Policy.from_weights(setup.model.cfg, setup.model.weights, device=setup.device)
        self.optimizer = make_optimizer(self.policy, grpo_cfg)
        self.engine = setup.engine(grpo_cfg.engine_dtype, masters=self.policy)  # the converted weights still
        self.telemetry = SyncTelemetry(self.policy, grpo_cfg.engine_dtype)
        self.rollouts = Rollouts(setup.task.prompts, grpo_cfg.group_size, grpo_cfg.max_new_tokens,
                                 grpo_cfg.temperature, grpo_cfg.seed, grpo_cfg.problems_per_step)
        self.step = 0  # rollout + train steps taken
        self.updates = 0  # steps that changed the masters

    def train_step(self, laps=None, phase: str = "GRPO steps") -> dict[str, float]:
        """One step; `laps` (runtime.Laps), where given, gets its rollouts and the rest (the
        update, the sync) as two laps of `phase`: which half a run's steps spend their time in."""
        from ratchet.rl.sync import sync_weights
        from ratchet.rl.telemetry import after_sync
        from ratchet.rl.update import grpo_step

        self.restore_engine()
        groups, _ = self.rollouts.collect(self.engine, self.step, version=self.step)
        if laps is not None:
            laps(f"{phase}: rollouts")
        # the engine holds the rounded masters: the trainer's weights, for the exact forward
        metrics = grpo_step(self.policy, self.optimizer, groups, self.setup.task, self.cfg,
                            version=self.step, engine=self.engine, engine_sampled=True)
        sync_weights(self.engine, self.policy)
        metrics.update(after_sync(self.telemetry, self.policy, self.engine, f"[ablate] step {self.step}:"))
        if laps is not None:
            laps(f"{phase}: trainer")
        self.step += 1
        self.updates += metrics["train/num_updates"] > 0
        return metrics

    def release_engine(self) -> None:
        """Drop the engine, and its GPU memory with it, until the next step: a measurement that
        never samples from it (ablate_decompose's gradient passes) runs without it."""
        self.engine = None

    def restore_engine(self) -> None:
        """The engine as it was, where released: made again on the converted weights and, once a
        step has synced it, synced from the masters (every step ends with that sync)."""
        from ratchet.rl.sync import sync_weights

        if self.engine is None:
            self.engine = self.setup.engine(self.cfg.engine_dtype, masters=self.policy)
            if self.step:
                sync_weights(self.engine, self.policy)

    def advance_to(self, updates: int, max_steps_per_update: int = 20, laps=None,
                   phase: str = "GRPO updates") -> None:
        """Train until the masters have seen `updates` updates (`laps`: as train_step)."""
        budget = self.step + max_steps_per_update * max(updates - self.updates, 0)
        while self.updates < updates:
            if self.step >= budget:
                raise RuntimeError(f"ablation run: {self.updates} updates after {self.step} steps; "
                                   "every group scored the same too often (raise "
                                   "ablate.max_steps_per_update or ablate.group_size)")
            self.train_step(laps, phase)

    def masters(self) -> dict:
        """A copy of the fp32 masters under the engine names, as torch tensors kept on the
        trainer's device (comparing 0.5B weights there is cheap, on the host it is not)."""
        return {k: v.detach().clone() for k, v in self.policy.export_weights().items()}
