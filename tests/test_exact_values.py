"""The exact forward's values (ratchet/rl/update.py exact_values): a batch-invariant engine
that drew every kept token at the trainer's weights already holds them, bit for bit, so the
colocated loop takes its sampling-time log-probs; anything else is scored."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from configured import ablate_settings
from tiny_setup import tiny_setup

from ratchet.mismatch.ablation import Trajectory
from ratchet.rl.experience import make_experience
from ratchet.rl.update import exact_values


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """A step's groups drawn by the trajectory's batch-invariant NumPy engine at version 0."""
    setup = tiny_setup(tmp_path_factory.mktemp("tiny"))
    settings = ablate_settings(problems_per_step=4, group_size=8, max_new_tokens=6, engine_dtype="fp16")
    traj = Trajectory(setup, settings.grpo("exact"))
    traj.cfg = dataclasses.replace(traj.cfg, skip_constant_groups=False)  # every answer kept
    groups, _ = traj.rollouts.collect(traj.engine, 0, version=0)
    return traj, groups


class Counting:
    """The engine, counting its `score` calls."""

    def __init__(self, engine):
        self.engine, self.calls = engine, 0
        self.batch_invariant = engine.batch_invariant

    def score(self, *args, **kwargs):
        self.calls += 1
        return self.engine.score(*args, **kwargs)


def test_sampling_time_values_are_the_engines_scores_bit_for_bit(drawn):
    traj, groups = drawn
    exp = make_experience(groups, traj.setup.task, traj.cfg, version=0)
    assert exp.mask.sum() > 50 and traj.engine.batch_invariant
    engine = Counting(traj.engine)
    taken = exact_values(exp, engine, traj.cfg, engine_sampled=True)
    assert engine.calls == 0  # no second pass
    scored = exact_values(exp, engine, traj.cfg, engine_sampled=False)
    assert engine.calls == 1
    assert torch.equal(taken[exp.mask], scored[exp.mask]) and torch.equal(taken, scored)


def test_stale_tokens_or_another_engine_are_scored(drawn):
    traj, groups = drawn
    stale = make_experience(groups, traj.setup.task, traj.cfg, version=1)  # the trainer moved on
    engine = Counting(traj.engine)
    exact_values(stale, engine, traj.cfg, engine_sampled=True)
    assert engine.calls == 1
    exp = make_experience(groups, traj.setup.task, traj.cfg, version=0)
    engine.batch_invariant = False  # a batch-dependent engine's replay need not be its sampling
    exact_values(exp, engine, traj.cfg, engine_sampled=True)
    assert engine.calls == 2
