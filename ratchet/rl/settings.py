"""GRPO's settings, built from the validated config: the schema holds every default, so
these fields have none of their own (tests/test_defaults.py checks it)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ratchet.config import ConfigError

# the fields read from `train.split` rather than `train`, and those from outside `train`
_SPLIT_KEYS = ("ahead", "extra_groups", "max_staleness", "engine_in")
_OUTSIDE_TRAIN = {"seed": ("seed",), "engine_dtype": ("engine", "dtype")}


def lookup(cfg: dict, key: tuple[str, ...]):
    for part in key:
        cfg = cfg[part]
    return cfg


@dataclass
class GRPOConfig:
    """The `train:` section, the seed and the engine dtype."""
    steps: int
    problems_per_step: int
    group_size: int
    max_new_tokens: int
    temperature: float
    lr: float
    betas: tuple[float, float]
    adam_eps: float
    weight_decay: float
    max_grad_norm: float
    clip_eps_low: float
    clip_eps_high: float
    advantage: str
    skip_constant_groups: bool
    old_logprobs: str
    is_correction: str
    is_level: str
    tis_cap: float
    mis_low: float
    mis_high: float
    round_weights: bool
    exact_forward: bool
    compute_dtype: str
    attention: str
    gradient_checkpointing: bool
    num_minibatches: int
    micro_batch_size: int
    micro_batch_tokens: int | None
    num_workers: int
    ahead: int
    extra_groups: int
    max_staleness: int
    engine_in: str
    checkpoint_every: int
    keep_checkpoints: int
    eval_every: int
    eval_problems: int
    verify_steps: int
    seed: int
    engine_dtype: str

    def __post_init__(self):
        from ratchet.rl.loss_names import ADVANTAGE_SCALES, BUILTIN_POLICY_LOSSES, IS_LEVELS

        # the loss module (torch) only for a variant registered beyond the built-in ones: the
        # Snakefile, the report and the tables' jobs read settings and never compute a loss
        if self.is_correction in BUILTIN_POLICY_LOSSES:
            losses = tuple(BUILTIN_POLICY_LOSSES)
        else:
            from ratchet.rl.loss import POLICY_LOSSES

            losses = tuple(POLICY_LOSSES)

        self.betas = tuple(self.betas)
        checks = [
            (self.steps >= 1, "steps must be >= 1"),
            (self.group_size >= 2, "group_size must be >= 2 (an advantage needs a group)"),
            (self.problems_per_step % self.num_workers == 0,
             f"problems_per_step {self.problems_per_step} must be a multiple of "
             f"num_workers {self.num_workers}"),
            (self.advantage in ADVANTAGE_SCALES, f"advantage must be one of {ADVANTAGE_SCALES}"),
            (self.old_logprobs in ("trainer", "engine"), "old_logprobs must be 'trainer' or 'engine'"),
            (self.is_correction in losses, f"is_correction must be one of {losses}"),
            (self.is_level in IS_LEVELS, f"is_level must be one of {IS_LEVELS}"),
            (self.ahead in (0, 1), "split.ahead must be 0 (synchronous) or 1 (one step ahead)"),
            (self.engine_in in ("auto", "thread", "process"), "split.engine_in must be auto, thread or process"),
            (self.temperature > 0, "temperature must be > 0"),
            (self.round_weights or not self.exact_forward, "exact_forward needs round_weights"),
            (self.mis_low <= self.mis_high,
             f"mis_low {self.mis_low} is above mis_high {self.mis_high} (MIS would mask every token)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"config train: {message}")

    @staticmethod
    def schema_key(name: str) -> tuple[str, ...]:
        """Where field `name` lives in the config."""
        if name in _OUTSIDE_TRAIN:
            return _OUTSIDE_TRAIN[name]
        return ("train", "split", name) if name in _SPLIT_KEYS else ("train", name)

    @classmethod
    def from_config(cls, cfg: dict) -> "GRPOConfig":
        """From a validated config (ratchet.config.validate fills every default)."""
        return cls(**{f.name: lookup(cfg, cls.schema_key(f.name)) for f in fields(cls)})

    @property
    def weight_dtype(self) -> str:
        return self.engine_dtype if self.round_weights else "fp32"

    @property
    def groups_per_worker(self) -> int:
        return self.problems_per_step // self.num_workers
