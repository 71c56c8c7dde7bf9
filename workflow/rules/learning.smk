# ablate_learning: one GRPO run per (engine dtype, remedy), each its own job, so that a GPU
# runs as many side by side as --resources gpu_jobs=N allows; then one job compares them.
# Not part of `all`: `snakemake ablate_learning`.
from ratchet.mismatch.ablation import ENGINE_DTYPES, FIX_RUNS
from ratchet.mismatch.learning import LearningSettings

LEARNING_JOBS = LearningSettings.from_config(config).jobs()


rule ablate_learning_run:
    input:
        build=rules.build_engine.output.build,
        train=rules.download_data.output.train,
        test=rules.download_data.output.test,
    output:
        steps=P.learning_steps("{dtype}", "{remedy}"),
        answers=P.learning_answers("{dtype}", "{remedy}"),
    wildcard_constraints:
        dtype="|".join(ENGINE_DTYPES),
        remedy="|".join(FIX_RUNS),
    params:
        settings=learning_run_settings(),
    priority: gpu_priority("ablate_learning_run", 6)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=job_gpu_mem_gib("ablate_learning_run"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_learning_run-{dtype}-{remedy}"),
    benchmark:
        P.benchmark("ablate_learning_run-{dtype}-{remedy}")
    shell:
        ratchet_cmd("ablate_learning_run", " --job dtype={wildcards.dtype:q} --job remedy={wildcards.remedy:q}")


rule ablate_learning:
    input:
        steps=[P.learning_steps(**job) for job in LEARNING_JOBS],
        answers=[P.learning_answers(**job) for job in LEARNING_JOBS],
    output:
        table=P.learning_table,
        diffs=P.learning_diffs,
        curves=P.learning_curves,
        figure=report(
            P.learning_figure,
            caption="../report/learning.rst",
            category="Mismatch ablations",
            labels={"figure": "learning with each remedy"},
        ),
        record=P.learning_summary,
    params:
        settings=stage_settings("ablate_learning"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_learning"),
    shell:
        ratchet_cmd("ablate_learning")
