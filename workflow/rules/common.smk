import json
import math
import os
import sys
from shlex import quote as shlex_quote

from snakemake.settings.types import DeploymentMethod
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

import ratchet.config
from ratchet.config import set_overrides
from ratchet.device import resolve_backend
from ratchet.gpu_oom import check_gpu_memory
from ratchet.preflight import check_device, check_settings
from ratchet.tracking_store import TrackingStoreError, check_store
from ratchet.paths import RunPaths
from ratchet.stages import export_to_jobs, gpu_memory_wanted, settings
from ratchet.stages.registry import stage_jobs
from ratchet.tracking import (PIPELINE_ENV, close_abandoned_pipelines, end_pipeline, preload_mlflow,
                              start_forkserver, tracking_uri)
from ratchet.tracking import enabled as tracking_enabled

# Fill defaults and reject unknown keys or wrong types with a message naming the key, before
# any rule runs; then the standard schema check (a no-op on a config that passed). A GPU
# profile on a machine without one stops here too. One line, no traceback.
# `--config set='train.steps=10 eval.num_problems=50'`: dotted keys, which Snakemake's own
# --config refuses; applied over the profile like the CLI's key=value overrides.
try:
    resolved = ratchet.config.apply_overrides(config, set_overrides(config.pop("set", "")))
    config.clear()
    config.update(ratchet.config.validate(resolved))
    check_settings(config)  # rules spanning keys (train.mis_low <= mis_high, ...)
    BACKEND = resolve_backend(config["engine"]["backend"])
    check_device(config, BACKEND)
except (ValueError, RuntimeError) as e:  # ConfigError, InputError, resolve_backend's
    sys.exit(f"ratchet: {e}")
validate(config, str(ratchet.config.SCHEMA_PATH))

P = RunPaths.from_config(config)
GPU_JOB_SLOTS = config["gpu_job_slots"]  # of --resources gpu_jobs (profiles/default: 2) a GPU rule takes


def gpu_mem_gib(stage, wildcards=None):
    """The GiB a GPU rule's job holds at its peak (config gpu_memory_gib, rounded up; 0 where
    none is stated; `wildcards`, a job's: its own statement where the config has one). Given
    the GPU's memory (`--resources gpu_mem_gib=140`), Snakemake starts only the GPU rules that
    fit beside those running; without it the jobs still wait on the GPU itself
    (ratchet/gpu_claim.py), each holding a gpu_jobs slot as it waits."""
    jobs = None
    if wildcards is not None:  # the registry's job, whose keys are in its label's order
        given = dict(wildcards.items())
        jobs = [job for job in stage_jobs(stage, config) if job == given] or [given]
    return math.ceil(gpu_memory_wanted(stage, config, jobs))


def gpu_priority(stage, own):
    """A GPU rule's Snakemake priority: the profile's (config gpu_priority), else the rule's own."""
    stated = config["gpu_priority"].get(stage)
    return own if stated is None else stated


def job_gpu_mem_gib(stage):
    """gpu_mem_gib of each job of a rule with wildcards, as Snakemake asks for it."""
    return lambda wildcards: gpu_mem_gib(stage, wildcards)


def all_cores_but_one():
    """The threads of convert_weights, CPU-bound and alone on the critical path. Snakemake
    sets OMP_NUM_THREADS to a rule's threads, 1 unless stated, so torch's elementwise kernels
    ran on one core of sixteen; one core is left for the rule beside it (download_data). 1 where
    no core count is given (a cluster executor without --cores)."""
    try:
        return max(1, int(workflow.cores) - 1)
    except WorkflowError:  # no --cores
        return 1

# The stages read the whole validated config from the environment the jobs inherit, and all
# jobs of this invocation share one MLflow parent run. Each rule names the config sections it
# depends on as params, so a change reruns exactly the stages it touches.
MAIN = workflow.is_main_process and not workflow.dryrun
export_to_jobs(config, main_process=MAIN)

# The tracking store answers within seconds or the pipeline stops here with one line; parent
# runs of earlier invocations that were killed (and their RUNNING rules) are marked KILLED.
if MAIN and tracking_enabled():
    try:
        check_store(tracking_uri(P.results_dir))
    except TrackingStoreError as e:
        sys.exit(f"ratchet: {e}")
    close_abandoned_pipelines(P.results_dir, current=os.environ.get(PIPELINE_ENV))


def stage_settings(stage):
    return json.dumps(settings(stage, config), sort_keys=True)


# Under --use-conda the rule's environment provides `python`; otherwise Snakemake's own
# interpreter runs the stage, so the pipeline works without an activated virtualenv.
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    PYTHON = "python"
else:
    PYTHON = shlex_quote(sys.executable)


def job_settings(stage, *jobs):
    """A job's settings less the ablate lists that only enumerate the jobs (ablate.fix_runs, ...):
    adding a remedy or an engine dtype reruns none of the others (ablate.parallel_jobs true or
    fix_runs; gradient jobs exist only with true). Without ablate.parallel_jobs
    the one job `all` runs every item of the lists, so they stay."""
    s = settings(stage, config)
    if s["ablate"]["parallel_jobs"]:
        s["ablate"] = {k: v for k, v in s["ablate"].items() if k not in jobs}
    return json.dumps(s, sort_keys=True)


def learning_run_settings():
    """The run's settings, less the lists of runs: adding a remedy reruns none of the others."""
    s = settings("ablate_learning_run", config)
    s["ablate"] = {**s["ablate"], "learning": {k: v for k, v in s["ablate"]["learning"].items()
                                               if k not in ("engine_dtypes", "runs")}}
    return json.dumps(s, sort_keys=True)


def ratchet_cmd(stage, args=""):
    """The shell command of a rule: the stage (and `args`, e.g. a job's quoted wildcards), its
    output to the rule's log, its progress lines to the console Snakemake runs in (fd 3, a copy
    of the job's stderr)."""
    return f"{PYTHON} -m ratchet {stage} --config-from-env{args} --progress-fd 3 3>&2 > {{log:q}} 2>&1"


def where_to_look():
    """The lines a finished run ends with: its outputs, and the commands that open them."""
    lines = [f"ratchet: {config['run_name']} done; results in {P.root}/"]
    if os.path.isfile(P.report_summary):
        lines.append(f"  summary table: {P.report_summary}")
        lines.append(f"  report:        snakemake --report report.html{profile_args()}  (then open report.html)")
    if tracking_enabled():
        lines.append(f"  MLflow runs:   mlflow ui --backend-store-uri {shlex_quote(tracking_uri(P.results_dir))}")
    return "\n".join(lines)


def profile_args():
    return "".join(f" --configfile {shlex_quote(str(f))}" for f in workflow.overwrite_configfiles)


def rules_to_run():
    """The rules of the jobs this invocation runs (Snakemake's DAG, built by onstart's time);
    None where it cannot be read, so the check below covers every rule instead."""
    try:
        return {job.rule.name for job in workflow.dag.needrun_jobs()}
    except AttributeError:  # a Snakemake without this DAG API: the check is a warning, never a stop
        return None


onstart:
    # A GPU smaller than the stated peaks of rules this run will start: said once, before the
    # first of them runs out of memory (each such rule still runs, alone on its GPU)
    if shortfall := check_gpu_memory(config, BACKEND, rules_to_run()):
        print(f"ratchet: warning: {shortfall}", file=sys.stderr)
    # this process closes the parent run at the end (end_pipeline): MLflow imported meanwhile;
    # the jobs' tracking workers are forked by one process that imports it once
    if tracking_enabled():
        preload_mlflow()
        start_forkserver()


onsuccess:
    end_pipeline(config["results_dir"], "FINISHED")
    print(where_to_look())


onerror:
    end_pipeline(config["results_dir"], "FAILED")
