# ratchet: the training-inference mismatch study as a pipeline.
#
#   snakemake --cores all                                # the tiny CPU default
#   snakemake --cores all --configfile config/paper.yaml # the study on GPUs
#
# Each rule calls one stage function of the `ratchet` package (ratchet/stages/) and is one
# MLflow child run of this invocation's parent run.

import os


# The tiny profile is the default, not a base: with --configfile PROFILE it is not read, so a
# profile is laid over the schema's defaults exactly as `ratchet <stage> --config PROFILE` does.
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config", "config.yaml")



include: "workflow/rules/common.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/ablate.smk"
include: "workflow/rules/learning.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        rules.eval_baseline.output.summary,
        rules.eval_after_colocated.output.summary,
        rules.eval_after_split.output.summary,
        rules.export_colocated.output.record,
        rules.export_split.output.record,
        rules.verify.output.repro,
        rules.report.output.summary,
    default_target: True
