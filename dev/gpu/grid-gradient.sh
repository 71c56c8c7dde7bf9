#!/usr/bin/env bash
# GPU calls: issue 21's real-model measurements that need no timing, detached and polled:
#   - ablate_decompose and ablate_gradient (the gap by source, visibility, gradients) on the local profile (the source as converted);
#   - ablate_decompose on the released-bf16 condition (run local-bf16grid, convert.snap_to=bf16),
#     beside it, in its own process (its own results folder);
#   - then dev/grid_conditions over both runs.
# SNAPPED_ONLY=1: the released-bf16 condition alone (the other run's tables already recorded).
#   bash dev/gpu/grid-gradient.sh start
#   bash dev/gpu/grid-gradient.sh wait      # poll up to WAIT_S s (default 540)
#   bash dev/gpu/grid-gradient.sh collect   # -> $OUT/h200-grid-gradient.tgz
# Before: as dev/gpu/ablate.sh (wheels, data, model chunks in /root/m, .cache/commit).
set -uo pipefail
source dev/gpu/env.sh
source dev/gpu/detached.sh
state=/root/grid-gradient
snapped=(run_name=local-bf16grid convert.snap_to=bf16)

case "${1:?start, wait or collect}" in
start)
  inputs_in_place || exit 1
  export RATCHET_TRACKING=${RATCHET_TRACKING:-off}
  start_detached "$state" dev/gpu/grid-gradient.sh
  sleep 15 && tail -3 "$state/run.log"
  ;;
run)
  mkdir -p "$state" && t0=$(date +%s.%N)
  (for stage in download_model download_data convert_weights build_engine ablate_decompose ablate_gradient_run ablate_gradient; do
     python3 -m ratchet "$stage" --config config/local.yaml "${snapped[@]}" || exit 1
   done) > "$state/bf16grid.log" 2>&1 &
  snapped_pid=$!
  rc=0
  if [ -z "${SNAPPED_ONLY:-}" ]; then
    python3 -m snakemake ablate_decompose ablate_gradient --cores all --resources gpu_jobs=2 \
      --configfile config/local.yaml --nolock > "$state/snakemake.log" 2>&1 || rc=1
  fi
  wait "$snapped_pid" || rc=1
  if [ "$rc" = 0 ] && [ -z "${SNAPPED_ONLY:-}" ]; then
    python3 -m dev.grid_conditions --run results/local --run results/local-bf16grid \
      --out "$state/grid-conditions.json" >> "$state/snakemake.log" 2>&1 || rc=1
  fi
  python3 -c "print($(date +%s.%N) - $t0)" > "$state/wall_s"
  echo "$rc" > "$state/rc"
  ;;
wait)
  wait_done "$state" || exit 3
  grep -E "Finished jobid|Error|error|Exiting" "$state/snakemake.log" | tail -8
  for f in results/local/logs/ablate_{decompose,gradient}.log "$state/bf16grid.log"; do
    [ -f "$f" ] && { echo "== $f"; grep -E "^\[ablate" "$f" | tail -6 | cut -c1-220; }
  done
  [ -f "$state/rc" ] && echo "rc $(cat "$state/rc"), wall $(cat "$state/wall_s") s" || echo "still running"
  ;;
collect)
  out=$OUT/h200-grid-gradient && mkdir -p "$out/local" "$out/local-bf16grid"
  cp -r results/local/ablate results/local/benchmarks "$out/local/" 2>/dev/null
  cp results/local/logs/ablate_*.log "$out/local/" 2>/dev/null
  cp -r results/local-bf16grid/ablate "$out/local-bf16grid/" 2>/dev/null
  cp results/local-bf16grid/logs/*.log "$out/local-bf16grid/" 2>/dev/null
  cp results/local-bf16grid/model/manifest.json "$out/local-bf16grid/" 2>/dev/null
  cp "$state"/*.log "$state"/*.json "$state/wall_s" .cache/commit "$out/" 2>/dev/null
  [ -d results/local/ablate ] && python3 -m dev.ablate_record --ablate results/local/ablate --config config/local.yaml \
    --commit "$(cat .cache/commit 2>/dev/null)" --machine "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    --command "bash dev/gpu/grid-gradient.sh start" --out "$out/h200-gradient.json"
  tar czf "$out.tgz" -C "$OUT" h200-grid-gradient && rm -rf "$out"
  ;;
esac
