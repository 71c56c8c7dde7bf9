#!/usr/bin/env bash
# GPU calls: does the trainer's arithmetic change learning? One split training of the local
# profile per train.compute_dtype (DTYPES, default fp32 bf16 fp16; micro-batches of 8 for fp32,
# MB for the others, default 64, cut at TOKENS padded tokens a pass where set), 100 steps from
# the same seed, each scored on all 1,319 test problems; detached and polled, then gathered by
# dev/dtype_learning.py:
#   bash dev/gpu/dtype-learning.sh start
#   bash dev/gpu/dtype-learning.sh wait      # poll up to WAIT_S s (default 540)
#   bash dev/gpu/dtype-learning.sh collect   # -> $OUT/dtype-learning/ (record, per-run folders)
# Before: as dev/gpu/ablate.sh (wheels, data, model chunks in /root/m, .cache/commit).
set -uo pipefail
source dev/gpu/env.sh
source dev/gpu/detached.sh
state=/root/dtype-learning
run=${RUN:-local}  # results/<RUN>: its own folder lets it run beside another job on run local

case "${1:?start, wait or collect}" in
start)
  inputs_in_place || exit 1
  export RATCHET_TRACKING=${RATCHET_TRACKING:-off} DTYPES=${DTYPES:-fp32 bf16 fp16} MB=${MB:-64} TOKENS=${TOKENS:-}
  start_detached "$state" dev/gpu/dtype-learning.sh
  sleep 15 && tail -3 "$state/run.log"
  ;;
run)
  mkdir -p "$state" && t0=$(date +%s)
  for stage in download_model download_data convert_weights build_engine; do
    python3 -m ratchet "$stage" --config config/local.yaml run_name="$run" || { echo 1 > "$state/rc"; exit 1; }
  done
  for dtype in $DTYPES; do
    mb=$MB && [ "$dtype" = fp32 ] && mb=8
    set_args=(--config config/local.yaml --force run_name="$run" train.compute_dtype="$dtype" train.micro_batch_size="$mb")
    [ -n "${TOKENS:-}" ] && [ "$dtype" != fp32 ] && set_args+=(train.micro_batch_tokens="$TOKENS")
    python3 -m ratchet train_split "${set_args[@]}" > "$state/train-$dtype.log" 2>&1 &&
      python3 -m ratchet eval_after_split "${set_args[@]}" > "$state/eval-$dtype.log" 2>&1 || {
        echo "$dtype failed"; tail -20 "$state/train-$dtype.log"; continue; }
    mkdir -p "$state/$dtype"
    cp "results/$run/train/split/metrics.parquet" "results/$run/eval/after_split.json" \
       "results/$run/eval/after_split_answers.parquet" "$state/$dtype/"
    echo "$dtype done at $(( $(date +%s) - t0 )) s"
  done
  echo $(( $(date +%s) - t0 )) > "$state/wall_s"
  echo 0 > "$state/rc"
  ;;
wait)
  wait_done "$state" || exit 3
  tail -4 "$state/run.log"
  for f in "$state"/train-*.log; do [ -f "$f" ] && { echo "== $f"; grep "^\[split\] step" "$f" | tail -1; }; done
  [ -f "$state/rc" ] && echo "rc $(cat "$state/rc"), wall $(cat "$state/wall_s" 2>/dev/null) s" || echo "still running"
  ;;
collect)
  out="$OUT/dtype-learning" && mkdir -p "$out"
  runs=() && for d in fp32 bf16 fp16; do [ -d "$state/$d" ] && cp -r "$state/$d" "$out/" && runs+=(--run "$d=$state/$d"); done
  cp "$state"/*.log "$out/" 2>/dev/null
  python3 -m dev.dtype_learning "${runs[@]}" --commit "$(cat .cache/commit 2>/dev/null)" \
    --command "bash dev/gpu/dtype-learning.sh start (DTYPES='${DTYPES:-fp32 bf16 fp16}' MB=${MB:-64} TOKENS=${TOKENS:-} RUN=$run)" \
    --out "$out/h200-dtype-learning.json"
  ;;
esac
