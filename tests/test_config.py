"""The config schema: defaults filled, bad keys and types named, profiles valid."""

import math
import re
from pathlib import Path

import pytest

from ratchet import config as cfgmod
from ratchet.paths import RunPaths
from ratchet.stages import gpu_memory_wanted

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_fill_every_key():
    cfg = cfgmod.validate({})
    assert cfg["run_name"] == "tiny"
    assert cfg["model"]["source"] == "tiny"
    assert cfg["engine"]["dtype"] == "fp16"
    assert cfg["model"]["tiny"]["hidden_size"] > 0


def test_every_schema_key_has_description_and_default():
    def walk(node, where):
        for key, sub in node.get("properties", {}).items():
            assert "description" in sub, f"{where}{key} has no description"
            assert "default" in sub, f"{where}{key} has no default"
            walk(sub, f"{where}{key}.")

    walk(cfgmod.load_schema(), "")


PROFILES = {"config.yaml": "tiny", "paper.yaml": "paper", "local.yaml": "local", "local-1.5b.yaml": "local-1.5b"}


@pytest.mark.parametrize("profile", list(PROFILES))
def test_profiles_validate(profile):
    cfg = cfgmod.load(ROOT / "config" / profile)
    assert cfg["run_name"] == PROFILES[profile]


def test_the_15b_profile_is_the_local_study_on_the_larger_model():
    """local-1.5b.yaml differs from local.yaml only in its run name, model file, checkpoints
    (none: the two trainings' would not fit the lent machine's disk), GPU memory stated (a large
    rule beside an eval, never beside another large rule, but for the two trainings, which
    recompute their layers in the backward to fit together: train.gradient_checkpointing, the
    ablations' measured without it; and ablate_fix_run beside either training since its runs'
    memory goes with each run, CuPy's cached blocks included, and ablate_decompose beside either
    training with one sharing set of gradients a pass: ablate.gradients_at_once; since its idle
    engines go back through the passes it fits beside ablate_fix_run too, which gpu_priority
    declines, and it is one job, so two of it never meet; verify reruns the trainings' jobs
    without their in-training eval, so it states no more than the larger training and runs beside
    either ablation) and the ablations' answers a pass
    (8: their fp32 passes of 64 at 1.5B are not planned in memory)."""
    small, big = (cfgmod.load(ROOT / "config" / p) for p in ("local.yaml", "local-1.5b.yaml"))
    assert big["model"]["path"].endswith("qwen2.5-coder-1.5b-instruct.gguf")
    assert (small["train"]["keep_checkpoints"], big["train"]["keep_checkpoints"]) == (2, 0)
    large = ("train_colocated", "train_split", "verify", "ablate_decompose", "ablate_gradient_run", "ablate_fix_run")
    trainings = {"train_colocated", "train_split"}
    pairs = [trainings, {"train_colocated", "ablate_fix_run"}, {"train_split", "ablate_fix_run"},  # the fix runs' one job
             {"train_colocated", "ablate_decompose"}, {"train_split", "ablate_decompose"},  # one sharing set a pass
             {"ablate_decompose", "ablate_fix_run"},  # idle engines released through the passes
             {"verify", "ablate_fix_run"}, {"verify", "ablate_decompose"}]  # verify: a training's jobs
    total, mem = 140, big["gpu_memory_gib"]  # an H200's GiB
    paths = RunPaths.from_config(big)
    one_job = {rule for rule, out in (("ablate_decompose", paths.decompose_table), ("verify", paths.verify_json))
               if "{" not in str(out)}  # an output without a wildcard: the rule is one job
    for i, a in enumerate(large):
        for b in large[i + 1:]:
            if b == "verify" and a in trainings:
                continue  # verify reruns both trainings' first steps: it never runs beside one
            assert (mem[a] + mem[b] <= total) == ({a, b} in pairs), (a, b)
        # nor two jobs of one large rule (ablate_decompose and verify are one job each; the fix runs
        # are one job at 1.5B: ablate.parallel_jobs false)
        assert (a in trainings or 2 * mem[a] > total or a in one_job
                or (a == "ablate_fix_run" and not big["ablate"]["parallel_jobs"]))
    # it reruns their jobs without the in-training eval (tests/test_cupy_release.py): never more than the larger
    assert mem["verify"] <= max(mem[t] for t in trainings)
    assert all(mem[a] + mem["default"] <= total for a in large)
    assert mem["train_colocated"] + mem["train_split"] + mem["default"] <= total  # and an eval beside them
    assert (small["train"]["gradient_checkpointing"], big["train"]["gradient_checkpointing"]) == (False, True)
    assert (small["ablate"]["gradient_checkpointing"], big["ablate"]["gradient_checkpointing"]) == (None, False)
    assert (small["ablate"]["micro_batch_size"], big["ablate"]["micro_batch_size"]) == (64, 8)
    # the gradients along ablate_decompose's run in both; at 0.5B a job a fix run (they fit beside
    # the other rules), at 1.5B the five in one job (one large rule at a time)
    assert small["ablate"]["parallel_jobs"] == "fix_runs" and big["ablate"]["parallel_jobs"] is False
    stated = [{k: v for k, v in cfg["gpu_priority"].items() if v is not None} for cfg in (small, big)]
    assert stated[0] == {} and stated[1]  # the order of the large rules: the next test
    assert (small["ablate"]["gradients_at_once"], big["ablate"]["gradients_at_once"]) == (None, 1)
    for cfg in (small, big):
        cfg.pop("run_name"), cfg.pop("gpu_job_slots"), cfg["model"].pop("path"), cfg["train"].pop("keep_checkpoints")
        cfg.pop("gpu_memory_gib"), cfg.pop("gpu_priority")
        cfg["ablate"].pop("micro_batch_size"), cfg["ablate"].pop("parallel_jobs"), cfg["ablate"].pop("gradients_at_once")
        cfg["train"].pop("gradient_checkpointing"), cfg["ablate"].pop("gradient_checkpointing")
    assert small == big


def _started(ready: dict[str, int], running: set[str], mem: dict, total: int = 140) -> set[str]:
    """The jobs Snakemake's scheduler starts among `ready` ({rule: priority}) beside `running`:
    the set whose priorities sum highest that fits the GPU's GiB (its objective's first term;
    a tie fails the caller, whose order would then be the solver's)."""
    free = total - sum(mem[r] for r in running)
    best, best_score, ties = set(), 0, []
    for mask in range(1, 1 << len(ready)):
        chosen = {r for i, r in enumerate(ready) if mask >> i & 1}
        if sum(mem[r] for r in chosen) > free:
            continue
        score = sum(ready[r] for r in chosen)
        if score > best_score:
            best, best_score, ties = chosen, score, []
        elif best and score == best_score:
            ties.append(chosen)
    assert not ties, (best, ties)
    return best


def test_the_15b_profile_runs_its_two_ablations_each_beside_a_training():
    """The profile's gpu_priority starts ablate_decompose beside train_split, then beside
    train_colocated, and ablate_fix_run beside the rest of the colocated training, rather than
    both trainings first and the two ablations one after the other; verify then runs beside the
    fix runs, not after them. The two ablations fit the H200 together, so it is the priorities,
    not the memory, that keep them apart."""
    cfg = cfgmod.load(ROOT / "config" / "local-1.5b.yaml")
    own = {rule: int(p) for smk in (ROOT / "workflow" / "rules").glob("*.smk")  # the rules' own
           for rule, p in re.findall(r'priority: gpu_priority\("(\w+)", (\d+)\)', smk.read_text())}
    prio = {**own, **{k: v for k, v in cfg["gpu_priority"].items() if v is not None}}
    mem = {rule: math.ceil(gpu_memory_wanted(rule, cfg)) for rule in prio}  # what each asks Snakemake for
    ready = lambda *rules: {r: prio[r] for r in rules}  # noqa: E731
    assert mem["ablate_decompose"] + mem["ablate_fix_run"] <= 140  # they could share the GPU
    # after build_engine: every GPU rule of `all` but verify and the evals after training
    assert _started(ready("train_colocated", "train_split", "ablate_decompose", "ablate_fix_run", "eval_baseline"),
                    set(), mem) == {"ablate_decompose", "train_split"}
    # train_split done: the colocated training joins ablate_decompose (not the evals that fit)
    assert _started(ready("train_colocated", "ablate_fix_run", "eval_baseline", "eval_after_split"),
                    {"ablate_decompose"}, mem) == {"train_colocated"}
    # ablate_decompose done: the fix runs beside the colocated training
    assert _started(ready("ablate_fix_run", "eval_baseline", "eval_after_split"),
                    {"train_colocated"}, mem) == {"ablate_fix_run"}
    # the colocated training done: the evals beside the fix runs, then verify once two of them are done
    evals = ("eval_baseline", "eval_after_split", "eval_after_colocated")
    assert _started(ready("verify", *evals), {"ablate_fix_run"}, mem) == set(evals)
    assert _started(ready("verify"), {"ablate_fix_run", "eval_baseline", "eval_after_split"}, mem) == set()
    assert _started(ready("verify"), {"ablate_fix_run", "eval_after_colocated"}, mem) == {"verify"}
    # the rules' own order would start both trainings first, then the ablations one at a time
    own_ready = {r: own[r] for r in ("train_colocated", "train_split", "ablate_decompose", "ablate_fix_run",
                                     "eval_baseline")}
    assert _started(own_ready, set(), mem) == {"train_colocated", "train_split", "eval_baseline"}


def test_paper_profile_pins_revisions_and_study_settings():
    cfg = cfgmod.load(ROOT / "config" / "paper.yaml")
    assert len(cfg["model"]["revision"]) == 40 and len(cfg["data"]["revision"]) == 40
    assert cfg["model"]["repo_id"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert cfg["data"]["repo_id"] == "openai/gsm8k" and cfg["data"]["config_name"] == "main"
    assert cfg["engine"]["dtype"] == "fp16"
    assert cfg["eval"]["max_new_tokens"] == 512 and cfg["eval"]["num_problems"] is None


@pytest.mark.parametrize("bad, culprit", [
    ({"modle": {}}, "'modle'"),
    ({"model": {"tiny": {"hidden_sise": 8}}}, "'model.tiny.hidden_sise'"),
    ({"model": {"tiny": {"hidden_size": "wide"}}}, "'model.tiny.hidden_size'"),
    ({"seed": 1.5}, "'seed'"),
    ({"seed": -1}, "'seed'"),  # NumPy's generators refuse it, once a stage ran
    ({"engine": {"dtype": "fp8"}}, "'engine.dtype'"),
    ({"model": {"source": "gguf"}, "data": {"source": "local", "train_path": "a", "test_path": "b"}},
     "'model.path'"),
    ({"data": {"source": "local"}, "model": {"source": "gguf", "path": "x.gguf"}}, "'data.train_path'"),
])
def test_bad_config_names_the_key(bad, culprit):
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.validate(bad)
    assert culprit in str(err.value)


def test_overrides_parse_types():
    cfg = cfgmod.apply_overrides({}, ["eval.num_problems=5", "seed=3", "engine.dtype=bf16",
                                      "eval.num_problems=null", "x.lr=1e-6"])
    assert cfg["seed"] == 3 and cfg["engine"]["dtype"] == "bf16"
    assert cfg["eval"]["num_problems"] is None and cfg["x"]["lr"] == 1e-6
    with pytest.raises(cfgmod.ConfigError, match="key=value"):
        cfgmod.apply_overrides({}, ["seed"])


def test_a_run_name_of_digits_is_a_name_not_a_number():
    assert cfgmod.load(None, ["run_name=2024"])["run_name"] == "2024"
    assert cfgmod.validate({"run_name": 7})["run_name"] == "7"
    with pytest.raises(cfgmod.ConfigError, match="'run_name'"):
        cfgmod.validate({"run_name": 1.5})  # not a whole number: still refused, by its key


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(cfgmod.ConfigError, match="nope.yaml"):
        cfgmod.load(tmp_path / "nope.yaml")
