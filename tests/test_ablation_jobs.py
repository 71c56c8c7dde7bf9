"""The ablations as jobs (one remedy of ablate_fix, one engine dtype of the gradients, each in
a process of its own so that a GPU runs them side by side): each job alone gives the bits it
gives in one process that runs them all in turn, and the gathered tables are those of that
one process, row for row."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from configured import ablate_settings
from tiny_setup import tiny_setup

from ratchet.config import validate
from ratchet.errors import MissingInputError
from ratchet.mismatch.decompose import along_updates
from ratchet.mismatch.fix import fix_run, fix_runs, gather
from ratchet.mismatch.gradient import gather_dtypes

SETTINGS = dict(updates=(0, 2), num_rollouts=8, max_new_tokens=4, problems_per_step=4, group_size=8,
                lr=1e-6, engine_dtypes=("fp16", "bf16"), max_steps_per_update=30, seed=0,
                engine_dtype="fp16", micro_batch_size=5, fix_steps=4, fix_runs=("none", "exact", "tis"))


@pytest.fixture
def fresh(tmp_path_factory):
    """A new tiny Setup a call, as a job's process starts from (nothing cached or shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield lambda: tiny_setup(tmp_path_factory.mktemp("tiny"), num_measure=8, with_eval=True)
    torch.set_num_threads(threads)


def test_a_fix_run_alone_gives_the_bits_of_the_runs_in_turn(fresh):
    settings = ablate_settings(**SETTINGS)
    steps, runs = fix_runs(fresh(), settings)
    alone = [fix_run(fresh(), settings, name) for name in reversed(settings.fix_runs)][::-1]
    assert gather([s for s, _ in alone]).equals(steps) and gather([r for _, r in alone]).equals(runs)
    assert list(runs["run"]) == list(settings.fix_runs) and runs["eval_n"].gt(0).all()
    assert (steps.groupby("run", sort=False).size() == settings.fix_steps).all()


def test_the_gradient_a_dtype_at_a_time_gathers_to_the_table_of_one_run(fresh):
    settings = ablate_settings(**SETTINGS)
    whole = along_updates(fresh(), settings, visibility_updates=0, measure_at=(),
                          gradient_at=settings.gradient_updates)[2]
    parts = [along_updates(fresh(), settings, visibility_updates=0, measure_at=(),
                           gradient_at=settings.gradient_updates, gradient_dtypes=(d,))[2]
             for d in ("bf16", "fp16")]  # in either order: each part is its own run
    assert gather_dtypes(parts[::-1]).equals(whole)
    assert list(whole["engine_dtype"].iloc[:2]) == ["fp16", "fp16"] and set(whole["updates"]) == {0, 2}


def test_a_gather_without_its_jobs_names_the_command_that_makes_them(tmp_path):
    from ratchet.stages.ablate import ablate_fix, ablate_gradient

    cfg = validate({"results_dir": str(tmp_path), "ablate": {"fix_runs": ["none", "tis"]}})
    with pytest.raises(MissingInputError, match=r"ablate_fix: input .*fix/none/steps\.parquet does not "
                                                r"exist; run `snakemake ablate_fix` \(or `ratchet "
                                                r"ablate_fix_run --job remedy=none`\)"):
        ablate_fix(cfg, run=None)
    with pytest.raises(MissingInputError, match=r"ablate_gradient_run --job dtype=fp16"):
        ablate_gradient(cfg, run=None)


def test_a_job_that_is_no_remedy_or_dtype_is_one_clear_error(tmp_path):
    """Before it reads anything (there is nothing to read here)."""
    from ratchet.stages import ablate

    cfg = validate({"results_dir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"remedy='fast' is not one of \('none', 'fix', 'exact', 'tis', 'mis'\)"):
        ablate.ablate_fix_run(cfg, None, remedy="fast")
    with pytest.raises(ValueError, match=r"dtype='fp8' is not one of \('fp16', 'bf16', 'fp32'\)"):
        ablate.ablate_gradient_run(cfg, None, dtype="fp8")


def test_gathering_keeps_the_order_asked_for():
    a = pd.DataFrame({"updates": [0, 3], "engine_dtype": ["fp16"] * 2, "v": [1, 2]})
    b = pd.DataFrame({"updates": [0, 3], "engine_dtype": ["bf16"] * 2, "v": [3, 4]})
    assert list(gather_dtypes([a, b])["v"]) == [1, 3, 2, 4]
    assert list(gather([b, a])["v"]) == [3, 4, 1, 2]
