# The config this invocation resolved (profile over the schema's defaults, then overrides):
# not part of `all`; `snakemake resolved_config` writes it for a look.
rule resolved_config:
    output:
        config=P.resolved_config,
    params:
        config=json.dumps(config, sort_keys=True),
    localrule: True
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("resolved_config"),
    shell:
        f"{PYTHON} -m ratchet config --config-from-env --out {{output.config:q}} > {{log:q}} 2>&1"


rule download_model:
    output:
        record=P.source_done,
    params:
        settings=stage_settings("download_model"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("download_model"),
    shell:
        ratchet_cmd("download_model")


rule download_data:
    output:
        train=P.train_data,
        test=P.test_data,
    params:
        settings=stage_settings("download_data"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("download_data"),
    shell:
        ratchet_cmd("download_data")


rule convert_weights:
    input:
        record=rules.download_model.output.record,
    output:
        manifest=P.manifest,
    params:
        settings=stage_settings("convert_weights"),
    threads: all_cores_but_one()
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("convert_weights"),
    benchmark:
        P.benchmark("convert_weights")
    shell:
        ratchet_cmd("convert_weights")


rule build_engine:
    input:
        manifest=rules.convert_weights.output.manifest,
    output:
        build=P.build,
    params:
        settings=stage_settings("build_engine"),
    priority: gpu_priority("build_engine", 0)
    resources:
        gpu_jobs=GPU_JOB_SLOTS,
        gpu_mem_gib=gpu_mem_gib("build_engine"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("build_engine"),
    benchmark:
        P.benchmark("build_engine")
    shell:
        ratchet_cmd("build_engine")
