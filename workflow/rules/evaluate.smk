rule eval_baseline:
    input:
        build=rules.build_engine.output.build,
        test=rules.download_data.output.test,
    output:
        summary=P.eval_json("baseline"),
        answers=P.eval_answers("baseline"),
    params:
        settings=stage_settings("eval_baseline"),
    priority: gpu_priority("eval_baseline", 5)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("eval_baseline"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("eval_baseline"),
    benchmark:
        P.benchmark("eval_baseline")
    shell:
        ratchet_cmd("eval_baseline")


rule bench:
    input:
        build=rules.build_engine.output.build,
    output:
        bench=P.bench,
    params:
        settings=stage_settings("bench"),
    priority: gpu_priority("bench", 0)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("bench"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("bench"),
    benchmark:
        P.benchmark("bench")
    shell:
        ratchet_cmd("bench")
