#!/usr/bin/env bash
# GPU call: the local profile (real GGUF model, GSM8K) through eval_baseline, then HF
# transformers' greedy eval on the same prompts; results under $OUT.
set -uo pipefail
source dev/gpu/env.sh
bash dev/gpu/assemble-model.sh || exit 1
mkdir -p ../shared/data && ln -sfn /root/data/gsm8k ../shared/data/gsm8k
export RATCHET_TRACKING=on
start=$(date +%s)
python3 -m snakemake eval_baseline --cores 16 --configfile config/local.yaml 2>&1 | tail -5
echo "pipeline wall $(( $(date +%s) - start )) s"
cp results/local/eval/baseline.json results/local/engine/build.json "$OUT/" 2>/dev/null
tail -3 results/local/logs/*.log
cat results/local/benchmarks/*.tsv > "$OUT/benchmarks.tsv" 2>/dev/null
python3 -m dev.hf_eval --source .cache/real/qwen2.5-coder-0.5b-instruct.gguf \
  --model-dir results/local/model --test results/local/data/test.parquet \
  --answers results/local/eval/baseline_answers.parquet --out "$OUT/hf_eval.json" 2>&1 | tail -25
