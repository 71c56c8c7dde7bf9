# The decomposition and the visibility of updates study the same GRPO run: one rule measures
# both along it. With ablate.parallel_jobs the remedies' gradients replay that run to the same
# bits in one job per engine dtype, and ablate_fix's runs are one job each: on GPUs they run
# side by side (as many as --resources gpu_jobs and gpu_mem_gib allow). Without, the
# decomposition measures the gradients along its own run, and one job makes every fix run;
# with parallel_jobs "fix_runs", the fix runs are jobs and the gradients stay along the run.
# A job without a GPU gathers each table.
from ratchet.mismatch.ablation import ENGINE_DTYPES, EVERY, FIX_RUNS, fix_jobs, gradient_parts

FIX_JOBS, GRADIENT_PARTS = fix_jobs(config["ablate"]), gradient_parts(config["ablate"])


rule ablate_decompose:
    input:
        build=rules.build_engine.output.build,
        train=rules.download_data.output.train,
        test=rules.download_data.output.test,
    output:
        table=P.decompose_table,
        figure=report(
            P.decompose_figure,
            caption="../report/decompose.rst",
            category="Mismatch ablations",
            labels={"figure": "gap by source"},
        ),
        visibility=P.visibility_table,
        visibility_figure=report(
            P.visibility_figure,
            caption="../report/visibility.rst",
            category="Mismatch ablations",
            labels={"figure": "visibility of updates"},
        ),
        **({"gradient": P.gradient_part(EVERY)} if GRADIENT_PARTS == [EVERY] else {}),
    params:
        settings=stage_settings("ablate_decompose"),
    priority: gpu_priority("ablate_decompose", 8)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("ablate_decompose"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_decompose"),
    benchmark:
        P.benchmark("ablate_decompose")
    shell:
        ratchet_cmd("ablate_decompose")


rule ablate_gradient_run:
    input:
        build=rules.build_engine.output.build,
        train=rules.download_data.output.train,
        test=rules.download_data.output.test,
    output:
        part=P.gradient_part("{dtype}"),
    wildcard_constraints:
        dtype="|".join(ENGINE_DTYPES),
    params:
        settings=job_settings("ablate_gradient_run", "engine_dtypes"),
    priority: gpu_priority("ablate_gradient_run", 8)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=job_gpu_mem_gib("ablate_gradient_run"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_gradient_run-{dtype}"),
    benchmark:
        P.benchmark("ablate_gradient_run-{dtype}")
    shell:
        ratchet_cmd("ablate_gradient_run", " --job dtype={wildcards.dtype:q}")


rule ablate_gradient:
    input:
        parts=[P.gradient_part(d) for d in GRADIENT_PARTS],
    output:
        table=P.gradient_table,
        figure=report(
            P.gradient_figure,
            caption="../report/gradient.rst",
            category="Mismatch ablations",
            labels={"figure": "the gradient's error"},
        ),
    params:
        settings=stage_settings("ablate_gradient"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_gradient"),
    shell:
        ratchet_cmd("ablate_gradient")


rule ablate_fix_run:
    input:
        build=rules.build_engine.output.build,
        train=rules.download_data.output.train,
        test=rules.download_data.output.test,
    output:
        steps=P.fix_run_steps("{remedy}"),
        run=P.fix_run_summary("{remedy}"),
    wildcard_constraints:
        remedy="|".join((*FIX_RUNS, EVERY)),
    params:
        settings=job_settings("ablate_fix_run", "fix_runs"),
    priority: gpu_priority("ablate_fix_run", 7)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=job_gpu_mem_gib("ablate_fix_run"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_fix_run-{remedy}"),
    benchmark:
        P.benchmark("ablate_fix_run-{remedy}")
    shell:
        ratchet_cmd("ablate_fix_run", " --job remedy={wildcards.remedy:q}")


rule ablate_fix:
    input:
        steps=[P.fix_run_steps(r) for r in FIX_JOBS],
        runs=[P.fix_run_summary(r) for r in FIX_JOBS],
    output:
        table=P.fix_table,
        steps=P.fix_steps,
        figure=report(
            P.fix_figure,
            caption="../report/fix.rst",
            category="Mismatch ablations",
            labels={"figure": "the fix against TIS and MIS"},
        ),
    params:
        settings=stage_settings("ablate_fix"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_fix"),
    shell:
        ratchet_cmd("ablate_fix")


# vLLM beside ratchet's engine on the same masters (engine.backend vllm's extra): on demand,
# `snakemake ablate_decompose_vllm`, never part of `all`.
rule ablate_decompose_vllm:
    input:
        build=rules.build_engine.output.build,
        train=rules.download_data.output.train,
        test=rules.download_data.output.test,
    output:
        table=P.decompose_vllm_table,
        figure=P.decompose_vllm_figure,
    params:
        settings=stage_settings("ablate_decompose_vllm"),
    priority: gpu_priority("ablate_decompose_vllm", 0)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("ablate_decompose_vllm"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_decompose_vllm"),
    benchmark:
        P.benchmark("ablate_decompose_vllm")
    shell:
        ratchet_cmd("ablate_decompose_vllm")

