#!/usr/bin/env bash
# GPU calls: the mismatch ablations of the local profile (real GGUF model, GSM8K), i.e.
#   snakemake ablate_decompose ablate_gradient ablate_fix --cores all --resources gpu_jobs=2 --configfile config/local.yaml
# (with their inputs: download, convert, build), both ablations at once on the one GPU,
# detached (a device call lasts at most 10 minutes) and polled:
#   bash dev/gpu/ablate.sh start     # model + data in place, launch, return
#   bash dev/gpu/ablate.sh wait      # poll up to WAIT_S s (default 540), show progress
#   bash dev/gpu/ablate.sh collect   # tables, figures, logs and h200-ablate.json -> $OUT/h200-ablate.tgz
# Before: as dev/gpu/local-pipeline.sh (wheels, data, model chunks in /root/m, .cache/commit).
set -uo pipefail
source dev/gpu/env.sh
source dev/gpu/detached.sh
state=/root/ablate
command="snakemake ablate_decompose ablate_gradient ablate_fix --cores all --resources gpu_jobs=2 --configfile config/local.yaml"

case "${1:?start, wait or collect}" in
start)
  inputs_in_place || exit 1
  export RATCHET_TRACKING=${RATCHET_TRACKING:-off}
  start_detached "$state" dev/gpu/ablate.sh
  sleep 15 && tail -5 "$state/snakemake.log"
  ;;
run)
  run_timed "$state" python3 -m $command
  ;;
wait)
  wait_done "$state" || exit 3
  grep -E "Finished jobid|Error|error|Exiting" "$state/snakemake.log" | tail -15
  for f in results/local/logs/ablate_*.log; do echo "== $f"; grep -E "updates|run|after training" "$f" | tail -14 | cut -c1-200; done
  [ -f "$state/rc" ] && echo "rc $(cat "$state/rc"), wall $(cat "$state/wall_s") s" || echo "still running"
  ;;
collect)
  [ -f .cache/commit ] && export RATCHET_COMMIT=$(cat .cache/commit)
  mkdir -p "$OUT/h200-ablate"
  cp -r results/local/ablate results/local/benchmarks "$OUT/h200-ablate/" 2>/dev/null
  mkdir -p "$OUT/h200-ablate/logs" && cp results/local/logs/ablate_*.log "$OUT/h200-ablate/logs/" 2>/dev/null
  cp "$state/snakemake.log" "$state/wall_s" "$OUT/h200-ablate/" 2>/dev/null
  python3 -m dev.ablate_record --ablate results/local/ablate --config config/local.yaml \
    --commit "${RATCHET_COMMIT:-unknown}" --machine "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    --command "$command" --out "$OUT/h200-ablate/h200-ablate.json"
  tar czf "$OUT/h200-ablate.tgz" -C "$OUT" h200-ablate && rm -rf "$OUT/h200-ablate"
  ;;
esac
