#!/usr/bin/env bash
# GPU calls for the fast loop (issue 18): the weight-sync kernels, the GPU suite's sync tests,
# and the GRPO step bench (dev.grpo_step) on the local profile (GRPO_SET: one --set for it;
# SECTIONS noprio: the steps again with RATCHET_STREAM_PRIORITY=0), detached and polled:
#   VARIANTS=colocated:fp32,split:bf16 STEPS=10 bash dev/gpu/fast-loop.sh start
#   bash dev/gpu/fast-loop.sh wait       # poll up to WAIT_S s (default 540)
# Results in /root/fast (state) and, on `wait` once done, under $OUT/fast/.
# Before: the model chunks in /root/m, .whl and .cache/gsm8k carried (dev/gpu/check.sh).
set -uo pipefail
source dev/gpu/env.sh
source dev/gpu/detached.sh
state=/root/fast

case "${1:?now, start, wait or run}" in
now)  # in this call (at most 10 minutes): SECTIONS, then everything under $OUT/fast
  inputs_in_place || exit 1
  export RATCHET_TRACKING=off STEPS=${STEPS:-10} SECTIONS=${SECTIONS:-weights,sync,steps}
  export VARIANTS=${VARIANTS:-colocated:fp32,colocated:bf16,split:bf16}
  rm -rf "$state" && mkdir -p "$state" "$OUT/fast"
  bash dev/gpu/fast-loop.sh run
  tail -3 "$state/pytest-weights.txt" "$state/pytest-resume.txt" 2>/dev/null
  grep -h "^\[grpo_step\]" "$state"/grpo-step*.txt 2>/dev/null
  cp "$state"/*.json "$state"/*.txt "$OUT/fast/" 2>/dev/null
  ;;
start)
  inputs_in_place || exit 1
  export RATCHET_TRACKING=off STEPS=${STEPS:-10} SECTIONS=${SECTIONS:-weights,sync,steps}
  export VARIANTS=${VARIANTS:-colocated:fp32,colocated:bf16,split:bf16}
  start_detached "$state" dev/gpu/fast-loop.sh
  sleep 20 && tail -3 "$state/run.log"
  ;;
run)
  mkdir -p "$state" && t0=$(date +%s)
  case ",$SECTIONS," in *,weights,*)
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_cuda_weights.py -k copy_many > "$state/pytest-weights.txt" 2>&1 ;; esac
  case ",$SECTIONS," in *,resume,*)
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_checkpoint.py -k gpu -rA > "$state/pytest-resume.txt" 2>&1 ;; esac
  case ",$SECTIONS," in *,sync,*)
    python3 -m ratchet.bench --sections sync --out "$state/bench-sync.json" > "$state/bench-sync.txt" 2>&1 ;; esac
  case ",$SECTIONS," in *,steps,*)
    python3 -m dev.grpo_step --config config/local.yaml --steps "$STEPS" --variants "$VARIANTS" \
      ${GRPO_SET:+--set "$GRPO_SET"} --out "$state/grpo-step.json" > "$state/grpo-step.txt" 2>&1 ;; esac
  case ",$SECTIONS," in *,noprio,*)  # the same steps with the engine's stream at default priority (A/B)
    RATCHET_STREAM_PRIORITY=0 python3 -m dev.grpo_step --config config/local.yaml --steps "$STEPS" \
      --variants "$VARIANTS" ${GRPO_SET:+--set "$GRPO_SET"} --out "$state/grpo-step-noprio.json" \
      > "$state/grpo-step-noprio.txt" 2>&1 ;; esac
  echo $(( $(date +%s) - t0 )) > "$state/wall_s"
  echo 0 > "$state/rc"
  ;;
wait)
  wait_done "$state" || exit 3
  tail -3 "$state/pytest-weights.txt" 2>/dev/null
  grep -h "^\[grpo_step\]" "$state/grpo-step.txt" 2>/dev/null | tail -20
  grep -hE "Error|error" "$state/grpo-step.txt" 2>/dev/null | tail -5
  if [ -f "$state/rc" ]; then
    echo "done in $(cat "$state/wall_s") s"
    mkdir -p "$OUT/fast" && cp "$state"/*.json "$state"/*.txt "$OUT/fast/" 2>/dev/null
  else
    echo "still running"; tail -2 "$state/run.log"
  fi
  ;;
esac
