#!/usr/bin/env bash
# GPU call: a few GRPO steps of the local profile (real model, GSM8K, the study's settings)
# in colocated mode, to time generate/train/sync and read peak GPU memory; results under $OUT.
# CONFIG (default config/local.yaml; config/local-1.5b.yaml with MODEL=coder-1.5b), SET: more
# overrides (say train.gradient_checkpointing=true), STEPS (default 6).
set -uo pipefail
source dev/gpu/env.sh
bash dev/gpu/assemble-model.sh || exit 1
mkdir -p ../shared/data && ln -sfn /root/data/gsm8k ../shared/data/gsm8k
export RATCHET_TRACKING=off
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/gpu_mem_mib.txt" &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT  # else the sampler holds the call open to its time limit
config=${CONFIG:-config/local.yaml}
read -ra extra <<< "${SET:-}"
for s in download_model download_data convert_weights build_engine; do
  python3 -m ratchet "$s" --config "$config" > "$OUT/$s.log" 2>&1 || { tail -30 "$OUT/$s.log"; exit 1; }
done
python3 -m ratchet train_colocated --config "$config" "train.steps=${STEPS:-6}" \
  train.eval_every=100000 train.checkpoint_every=100000 "${extra[@]}" 2>&1 | tee "$OUT/train_colocated.log" | tail -40
sort -n "$OUT/gpu_mem_mib.txt" | tail -1 | sed 's/^/peak GPU memory MiB: /'
cp results/*/train/colocated/metrics.parquet "$OUT/" 2>/dev/null || true
