"""The stage registry and the Snakemake rules agree: every rule is a registered stage, reads at
least what the registry says it reads, and writes exactly what it says it writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ratchet.config import load, validate
from ratchet.paths import RunPaths
from ratchet.stages import STAGES, registry
from ratchet.stages.registry import stage_jobs

ROOT = Path(__file__).resolve().parents[1]
NOT_STAGES = {"all", "resolved_config"}  # the target, and the config dump (`ratchet config`)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> subprocess.CompletedProcess:
    """Snakemake's dry run of every target, with Python's import timings on stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "MLFLOW_"))}
    workdir = tmp_path_factory.mktemp("dry_run")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                           "--directory", str(workdir), "-n", "--cores", "1", "--", "all", "bench", "ablate_learning", "ablate_decompose_vllm",
                           "resolved_config"], capture_output=True, text=True, env={**env, "RATCHET_TRACKING": "off"},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _rules(proc: subprocess.CompletedProcess) -> dict[str, dict[str, set[str]]]:
    rules, current = {}, None
    for line in proc.stdout.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):", line):
            current = rules.setdefault(m.group(1), {"input": set(), "output": set()})
        elif current is not None and (m := re.match(r"^\s+(input|output): (.*)", line)):
            current[m.group(1)] |= set(m.group(2).split(", "))
    return rules


def test_rules_and_registry_name_the_same_paths(dry_run):
    rules = _rules(dry_run)
    cfg = load(ROOT / "config" / "config.yaml", [])  # the Snakefile's configfile
    jobless = {name for name in STAGES if not stage_jobs(name, cfg)}  # ablate_gradient_run here
    assert set(rules) - NOT_STAGES == set(STAGES) - jobless and jobless == {"ablate_gradient_run"}
    paths = RunPaths.from_config(cfg)
    for name, stage in STAGES.items():
        if name in jobless:
            continue
        declared = rules[name]  # a rule run per job: its jobs' paths together
        reads = {str(p) for job in stage_jobs(name, cfg) for p in registry.reads(name, paths, job)}
        writes = {str(p) for job in stage_jobs(name, cfg) for p in registry.writes(name, paths, job, cfg)}
        assert reads <= declared["input"], (name, reads - declared["input"])
        for path in writes:  # each written path is an output, or inside a directory output
            assert any(path == out or path.startswith(out + "/") for out in declared["output"]), (name, path)
        for out in declared["output"]:  # and no output is missing from the registry
            assert any(w == out or w.startswith(out + "/") for w in writes), (name, out)


def test_reading_the_workflow_imports_no_torch(dry_run):
    """Snakemake reads the Snakefile at its start, and again in every job of a cluster run:
    torch (~3 s to import) is the stages' business, not the workflow's."""
    imported = {line.split("|")[-1].strip() for line in dry_run.stderr.splitlines()
                if line.startswith("import time:")}
    assert "ratchet.config" in imported  # the timings are there to read
    assert "torch" not in imported, "the workflow's imports reach torch"


def _dry_run_resource(workdir: Path, resource: str, *args: str) -> dict[str, int]:
    """{rule: the value of `resource` its job asks for} in a dry run of `all` with `args`
    (`priority`: the job's priority, which the dry run prints beside its resources)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "MLFLOW_"))}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                           "--directory", str(workdir), "-n", "--cores", "1", *args, "--", "all"],
                          capture_output=True, text=True, env={**env, "RATCHET_TRACKING": "off"}, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    asked, rule = {}, None
    for line in proc.stdout.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):", line):
            rule = m.group(1)
        elif rule and (m := re.search(rf"\b{resource}[=:] ?(\d+)", line)):
            asked[rule] = int(m.group(1))
    return asked


def test_every_gpu_rule_takes_the_profiles_gpu_job_slots(tmp_path):
    """gpu_job_slots: 2 makes every GPU rule take both of the default limit's gpu_jobs, so a
    model whose trainings do not fit twice on the GPU runs them one at a time."""
    taken = {slots: _dry_run_resource(tmp_path, "gpu_jobs", "--config", f"set=gpu_job_slots={slots}")
             for slots in (1, 2)}
    assert {"train_colocated", "train_split", "ablate_decompose", "eval_baseline"} <= set(taken[1])
    assert set(taken[1].values()) == {1} and set(taken[2].values()) == {2} and set(taken[1]) == set(taken[2])


def test_every_gpu_rule_asks_snakemake_for_the_gpu_memory_its_profile_states(tmp_path):
    """gpu_memory_gib becomes each GPU rule's `gpu_mem_gib` resource (rounded up; the default
    for a stage not named, 0 where nothing is stated), so `--resources gpu_mem_gib=N` starts
    only the GPU rules that fit beside those running."""
    none, some = (_dry_run_resource(tmp_path, "gpu_mem_gib", "--resources", "gpu_mem_gib=100", "--config",
                                    f"set={stated}")
                  for stated in ("", "gpu_memory_gib.ablate_fix_run=66.2 gpu_memory_gib.default=16"))
    assert set(none) == set(some) and set(none) <= set(registry.GPU_STAGES) and "train_split" in none
    assert set(none.values()) == {0}
    assert some.pop("ablate_fix_run") == 67 and set(some.values()) == {16}


def test_a_profile_orders_the_gpu_rules_by_its_gpu_priority(tmp_path):
    """config gpu_priority becomes a GPU rule's Snakemake priority; a rule not named keeps its
    own (the trainings 10)."""
    asked = _dry_run_resource(tmp_path, "priority", "--config",
                              "set=gpu_priority.train_split=40 gpu_priority.build_engine=3")
    assert (asked["train_split"], asked["build_engine"], asked["train_colocated"]) == (40, 3, 10)
    with pytest.raises(ValueError, match="gpu_prority"):
        validate({"gpu_prority": {"train_split": 40}})
    with pytest.raises(ValueError, match="trian_split"):
        validate({"gpu_priority": {"trian_split": 40}})


def test_a_change_to_the_train_section_reruns_the_ablations_that_take_its_knobs():
    """The ablation runs are the train section's GRPO settings with ablate's over them
    (AblateSettings.train: its token cut, attention, AdamW's betas, ...): a change there must
    change their rules' params, so Snakemake reruns them."""
    base = validate({})
    cut = validate({"train": {"micro_batch_tokens": 4096}})
    for stage in ("ablate_decompose", "ablate_gradient_run", "ablate_fix_run", "ablate_learning_run"):
        assert registry.settings(stage, base) != registry.settings(stage, cut), stage
    assert registry.settings("report", base) == registry.settings("report", cut)


def test_the_gpu_stages_are_the_rules_that_take_gpu_jobs():
    """A stage claims its GPU on a machine of several (ratchet/gpu_claim.py) where its rule
    takes Snakemake's gpu_jobs: the registry's list and the rules agree."""
    taking = {}  # rule -> its block
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"\n(?=rule )", smk.read_text()):
            found = re.match(r"\s*rule (\w+):", block)
            if found and "gpu_jobs=" in block:
                taking[found.group(1)] = block
    assert set(taking) == set(registry.GPU_STAGES)
    # and each takes its priority from the profile (config gpu_priority) over its own
    for rule, block in taking.items():
        assert f'priority: gpu_priority("{rule}", ' in block, rule
    schema = yaml.safe_load((ROOT / "ratchet" / "schemas" / "config.schema.yaml").read_text())
    # the GPU memory a profile may state: one key a GPU stage, and a default
    assert set(schema["properties"]["gpu_memory_gib"]["properties"]) == {"default", *registry.GPU_STAGES}
    assert set(schema["properties"]["gpu_priority"]["properties"]) == set(registry.GPU_STAGES)


def test_the_stages_that_gather_tables_start_without_torch():
    """ablate_fix, ablate_gradient and ablate_learning only read parquet parts: their modules
    (and the timers they share with the GPU stages, rl/runtime.py) import no torch, whose import
    is ~3 s of each such process on a small CPU."""
    import subprocess
    import sys

    code = ("import sys\nimport ratchet.stages.ablate, ratchet.stages.learning, ratchet.rl.runtime\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_job_stated_alone_asks_for_its_own_gpu_memory(tmp_path):
    """gpu_memory_gib.<label> (ablate_fix_run-exact, as its log is named) over its stage's: the
    fix runs that hold less fit more of them beside the others; a job not named takes its
    stage's statement."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "MLFLOW_"))}
    stated = ("ablate.parallel_jobs=fix_runs gpu_memory_gib.ablate_fix_run=30 "
              "gpu_memory_gib.ablate_fix_run-exact=25.5 gpu_memory_gib.ablate_fix_run-none=20")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                           "--directory", str(tmp_path), "-n", "--cores", "1", "--resources", "gpu_mem_gib=100",
                           "--config", f"set={stated}", "--", "ablate_fix"],
                          capture_output=True, text=True, env={**env, "RATCHET_TRACKING": "off"}, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    asked, remedy = {}, None
    for line in proc.stdout.splitlines():
        if m := re.search(r"wildcards: remedy=(\w+)", line):
            remedy = m.group(1)
        elif remedy and (m := re.search(r"gpu_mem_gib=(\d+)", line)):
            asked[remedy], remedy = int(m.group(1)), None
    assert asked == {"none": 20, "fix": 30, "exact": 26, "tis": 30, "mis": 30}, proc.stdout[-3000:]
    cfg = validate({"gpu_memory_gib": {"ablate_fix_run": 30, "ablate_fix_run-exact": 25.5}})
    assert registry.gpu_memory_wanted("ablate_fix_run", cfg, [{"remedy": "exact"}]) == 25.5
    assert registry.gpu_memory_wanted("ablate_fix_run", cfg, [{"remedy": "tis"}, {"remedy": "exact"}]) == 30
    assert registry.gpu_memory_wanted("ablate_fix_run", cfg) == 30
