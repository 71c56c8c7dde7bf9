#!/usr/bin/env bash
# GPU call on a machine with two GPUs (kind nvidia-h200-x2): both modes of the local profile
# on two GPUs and, in the same session, on one, for issue 7. Needs the model in /root/m and
# the data in /root/data as for local-pipeline.sh. Results under $OUT/two-gpu/.
#   split on 2 GPUs:     the engine process on GPU 1, the trainer on GPU 0, weights over NCCL
#   colocated on 2 GPUs: two workers (train.num_workers=2), gradients all-reduced over NCCL
#   the same two on GPU 0 alone (CUDA_VISIBLE_DEVICES=0) for comparison
# STEPS (default 100) sets the training length of every run. (Checked on the CPU with the
# tiny config and STEPS=3: every run, eval and the summary go through.)
set -uo pipefail
source dev/gpu/env.sh
bash dev/gpu/assemble-model.sh || exit 1
mkdir -p ../shared/data && ln -sfn /root/data/gsm8k ../shared/data/gsm8k
export RATCHET_TRACKING=off
out="$OUT/two-gpu" && mkdir -p "$out"
for s in download_model download_data convert_weights build_engine; do
  python3 -m ratchet "$s" --config config/local.yaml > "$out/$s.log" 2>&1 || { tail -30 "$out/$s.log"; exit 1; }
done
steps=${STEPS:-100}
run() {  # name, visible GPUs, mode, extra overrides...
  local name=$1 gpus=$2 mode=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpus python3 -m ratchet "train_$mode" --config config/local.yaml \
    "train.steps=$steps" train.eval_every=100000 train.checkpoint_every=100000 \
    "results_dir=results/$name" "$@" > "$out/$name.log" 2>&1 || { tail -30 "$out/$name.log"; return 1; }
  CUDA_VISIBLE_DEVICES=${gpus%%,*} python3 -m ratchet "eval_after_$mode" --config config/local.yaml \
    "results_dir=results/$name" > "$out/$name.eval.log" 2>&1 || tail -5 "$out/$name.eval.log"
  cp "results/$name/local/train/$mode/metrics.parquet" "$out/$name.metrics.parquet"
  cp "results/$name/local/eval/after_$mode.json" "$out/$name.eval.json" 2>/dev/null
}
# one converted model and engine build for all runs; each run trains into its own folder
for name in split-2gpu colocated-2gpu split-1gpu colocated-1gpu; do
  mkdir -p "results/$name/local"
  for d in source data model engine; do ln -sfn "$PWD/results/local/$d" "results/$name/local/$d"; done
done
run split-2gpu 0,1 split train.split.engine_in=process  # a GPU job claims one GPU unless asked for two
run colocated-2gpu 0,1 colocated train.num_workers=2
run split-1gpu 0 split
run colocated-1gpu 0 colocated
# the split sync alone, trainer on GPU 0 -> engine on GPU 1 (NCCL), timed and checked bit for bit
python3 -m ratchet.bench.two_gpus --out "$out/sync.json" > "$out/sync.log" 2>&1 || tail -5 "$out/sync.log"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
import pandas as pd
from dev.record import training_summary
out = Path(sys.argv[1])
summary = {}
for p in sorted(out.glob("*.metrics.parquet")):
    name = p.name.split(".")[0]
    summary[name] = training_summary(pd.read_parquet(p))
    ev = out / f"{name}.eval.json"
    if ev.is_file():
        e = json.loads(ev.read_text())
        summary[name].update({"after_accuracy": e["accuracy"], "after_accuracy_stderr": e["accuracy_stderr"]})
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=1))
PY
