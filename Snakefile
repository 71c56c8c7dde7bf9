# ratchet: the training-inference mismatch study as a pipeline.
#
#   snakemake --cores all                                # the tiny CPU default
#   snakemake --cores all --configfile config/paper.yaml # the study on GPUs
#
# Each rule calls one stage function of the `ratchet` package (ratchet/stages/) and is one
# MLflow child run of this invocation's parent run.

configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/evaluate.smk"


rule all:
    input:
        rules.eval_baseline.output.summary,
    default_target: True
