from ratchet.stages.report import training_inputs


rule report:
    input:
        baseline=rules.eval_baseline.output.summary,
        decompose=rules.ablate_decompose.output.table,
        visibility=rules.ablate_decompose.output.visibility,
        fix=rules.ablate_fix.output.table,
        gradient=rules.ablate_gradient.output.table,
        training=lambda wildcards: training_inputs(P, workflow.rules),
    output:
        summary=P.report_summary,
        summary_html=report(
            P.report_summary_html,
            caption="../report/summary.rst",
            category="Summary",
            labels={"file": "summary"},
        ),
        training=report(
            P.report_training_figure,
            caption="../report/training.rst",
            category="Training",
            labels={"figure": "reward and gap per step"},
        ),
        records=P.ablate_summary,
    params:
        settings=stage_settings("report"),
    conda:
        "../envs/ratchet.yaml"
    log:
        P.log("report"),
    shell:
        ratchet_cmd("report")
