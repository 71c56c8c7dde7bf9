#!/usr/bin/env bash
# GPU calls: ablate_learning on the local profile (issue 21), detached and polled:
#   SET='ablate.learning.engine_dtypes=[fp16]' JOBS=2 bash dev/gpu/learning.sh start
#   bash dev/gpu/learning.sh wait      # poll up to WAIT_S s (default 540): runs done, the newest lines
#   bash dev/gpu/learning.sh collect   # tables, figure, summary, logs -> $OUT/h200-learning.tgz
# LEARN_TARGETS: run files to make in place of the whole comparison (e.g. the runs a session has
# left, aggregated afterwards where the earlier runs are);
# SET: snakemake's `set=` overrides (a subset of the runs fits one session: 5 runs of 100 steps
# at ~1.9 s a step, two at a time); JOBS: runs side by side on the one GPU (~45 GB each).
# Before: as dev/gpu/ablate.sh (wheels, data, model chunks in /root/m, .cache/commit).
set -uo pipefail
source dev/gpu/env.sh
source dev/gpu/detached.sh
state=/root/learning

case "${1:?start, wait or collect}" in
start)
  inputs_in_place || exit 1
  export RATCHET_TRACKING=${RATCHET_TRACKING:-off} LEARN_SET=${SET:-} LEARN_JOBS=${JOBS:-2}
  start_detached "$state" dev/gpu/learning.sh
  sleep 15 && tail -5 "$state/snakemake.log"
  ;;
run)
  mkdir -p "$state" && run_timed "$state" python3 -m snakemake ${LEARN_TARGETS:-ablate_learning} --cores all --configfile config/local.yaml \
    --resources gpu_jobs="$LEARN_JOBS" ${LEARN_SET:+--config set="$LEARN_SET"}
  ;;
wait)
  wait_done "$state" || exit 3
  grep -E "Finished jobid|Error|error|Exiting" "$state/snakemake.log" | tail -12
  for f in results/local/logs/ablate_learning_run*.log; do
    [ -f "$f" ] && { echo "== $f"; grep -E "step|accuracy" "$f" | tail -2 | cut -c1-200; }
  done
  [ -f "$state/rc" ] && echo "rc $(cat "$state/rc"), wall $(cat "$state/wall_s") s" || echo "still running"
  ;;
collect)
  mkdir -p "$OUT/h200-learning/logs"
  cp results/local/ablate/learning* "$OUT/h200-learning/" 2>/dev/null
  cp -r results/local/ablate/learning "$OUT/h200-learning/runs" 2>/dev/null
  cp results/local/logs/ablate_learning*.log "$OUT/h200-learning/logs/" 2>/dev/null
  cp "$state/snakemake.log" "$state/wall_s" .cache/commit "$OUT/h200-learning/" 2>/dev/null
  tar czf "$OUT/h200-learning.tgz" -C "$OUT" h200-learning && rm -rf "$OUT/h200-learning"
  ;;
esac
