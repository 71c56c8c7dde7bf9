# GRPO training in the two modes, each followed by its eval, and the rerun check.
# A training rule killed midway resumes from its newest checkpoint when rerun
# (results/<run>/train/<mode>/checkpoints/, deliberately not a declared output, so
# Snakemake never deletes it). train_split runs two processes, engine and trainer, but the
# trainer mostly waits on the engine, so it asks for one core like the others: on 2 cores
# the two trainings then run side by side. Longest first (priority): the trainings, then
# the ablations, the rerun check, the evals, so the jobs left at the end are short ones.


rule train_colocated:
    input:
        build=rules.build_engine.output.build,
        train=rules.download_data.output.train,
        test=rules.download_data.output.test,
    output:
        metrics=P.train_metrics("colocated"),
        trace=P.train_trace("colocated"),
        summary=P.train_summary("colocated"),
        manifest=P.train_manifest("colocated"),
    params:
        settings=stage_settings("train_colocated"),
    priority: gpu_priority("train_colocated", 10)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("train_colocated"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("train_colocated"),
    benchmark:
        P.benchmark("train_colocated")
    shell:
        ratchet_cmd("train_colocated")


rule train_split:
    input:
        build=rules.build_engine.output.build,
        train=rules.download_data.output.train,
        test=rules.download_data.output.test,
    output:
        metrics=P.train_metrics("split"),
        trace=P.train_trace("split"),
        summary=P.train_summary("split"),
        manifest=P.train_manifest("split"),
    params:
        settings=stage_settings("train_split"),
    priority: gpu_priority("train_split", 10)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("train_split"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("train_split"),
    benchmark:
        P.benchmark("train_split")
    shell:
        ratchet_cmd("train_split")


rule eval_after_colocated:
    input:
        manifest=rules.train_colocated.output.manifest,
        test=rules.download_data.output.test,
    output:
        summary=P.eval_json("after_colocated"),
        answers=P.eval_answers("after_colocated"),
    params:
        settings=stage_settings("eval_after_colocated"),
    priority: gpu_priority("eval_after_colocated", 5)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("eval_after_colocated"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("eval_after_colocated"),
    shell:
        ratchet_cmd("eval_after_colocated")


rule eval_after_split:
    input:
        manifest=rules.train_split.output.manifest,
        test=rules.download_data.output.test,
    output:
        summary=P.eval_json("after_split"),
        answers=P.eval_answers("after_split"),
    params:
        settings=stage_settings("eval_after_split"),
    priority: gpu_priority("eval_after_split", 5)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("eval_after_split"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("eval_after_split"),
    shell:
        ratchet_cmd("eval_after_split")


rule verify:
    input:
        colocated=rules.train_colocated.output.trace,
        split=rules.train_split.output.trace,
    output:
        repro=P.verify_json,
    params:
        settings=stage_settings("verify"),
    priority: gpu_priority("verify", 6)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("verify"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("verify"),
    benchmark:
        P.benchmark("verify")
    shell:
        ratchet_cmd("verify")


rule export_colocated:
    input:
        manifest=rules.train_colocated.output.manifest,
        source=rules.download_model.output.record,
    output:
        model=directory(P.export_dir("colocated")),
        record=P.export_record("colocated"),
    params:
        settings=stage_settings("export_colocated"),
    priority: 5
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("export_colocated"),
    shell:
        ratchet_cmd("export_colocated")


rule export_split:
    input:
        manifest=rules.train_split.output.manifest,
        source=rules.download_model.output.record,
    output:
        model=directory(P.export_dir("split")),
        record=P.export_record("split"),
    params:
        settings=stage_settings("export_split"),
    priority: 5
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("export_split"),
    shell:
        ratchet_cmd("export_split")
