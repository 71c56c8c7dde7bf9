# The decomposition, the visibility of updates and the remedies' gradients study the same
# GRPO run: one rule measures all three along it.
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
        gradient=P.gradient_table,
        gradient_figure=report(
            P.gradient_figure,
            caption="../report/gradient.rst",
            category="Mismatch ablations",
            labels={"figure": "the gradient's error"},
        ),
    params:
        settings=stage_settings("ablate_decompose"),
    priority: 8
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


rule ablate_fix:
    input:
        build=rules.build_engine.output.build,
        train=rules.download_data.output.train,
        test=rules.download_data.output.test,
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
    priority: 7
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("ablate_fix"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("ablate_fix"),
    benchmark:
        P.benchmark("ablate_fix")
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

