#!/usr/bin/env bash
# GPU calls: a session's GPU work as one queue, run one step after another by a detached job,
# so that the machine does not idle between calls and no two jobs fight for its memory (two
# ablations beside a training ran the GPU out of memory). A plan is a file of steps, one shell
# command a line (# comments, blank lines skipped), each with its own $OUT under the plan's state:
#   bash dev/gpu/plan.sh start dev/gpu/plans/NAME.txt
#   bash dev/gpu/plan.sh wait       # poll up to WAIT_S s (default 540): each step's state, newest lines
#   bash dev/gpu/plan.sh collect    # every step's $OUT so far -> $OUT/plan/stepN/, with the plan's log
# A line `#keep GLOB` (a path under the repo) names results a step writes as it goes, such as
# each finished learning run: every `wait` brings back what exists of them under $OUT/keep/,
# so a machine taken back mid-step loses only the unfinished part.
# A failing step is recorded (its rc) and the next one starts. Before: the inputs the steps need
# in place (wheels, data, model chunks; dev/gpu/assemble-model.sh runs on start).
set -uo pipefail
source dev/gpu/env.sh
source dev/gpu/detached.sh
state=${PLAN_STATE:-/root/plan}

steps() {  # the plan's commands, one a line
  grep -vE '^\s*(#|$)' "$state/plan.txt"
}

keep() {  # what the #keep lines name, copied under $OUT/keep/ with their paths
  local glob f
  grep -E '^#keep ' "$state/plan.txt" 2>/dev/null | cut -d' ' -f2- | while read -r glob; do
    # shellcheck disable=SC2086  # the glob is meant to expand
    for f in $glob; do [ -f "$f" ] && mkdir -p "$OUT/keep/$(dirname "$f")" && cp "$f" "$OUT/keep/$f"; done
  done
}

case "${1:?start, wait or collect}" in
start)
  plan=${2:?a plan file}
  [ -f "$plan" ] || { echo "no plan file $plan"; exit 1; }
  inputs_in_place || exit 1
  export RATCHET_TRACKING=${RATCHET_TRACKING:-off}
  rm -rf "$state" && mkdir -p "$state" && cp "$plan" "$state/plan.txt"
  setsid nohup bash dev/gpu/plan.sh run > "$state/run.log" 2>&1 < /dev/null &
  sleep 10 && tail -n 3 "$state/plan.log"
  ;;
run)
  n=$(steps | wc -l) i=0
  while IFS= read -r line; do
    i=$((i + 1)) && out="$state/out/step$i" && mkdir -p "$out"
    echo "[plan] step $i/$n start $(date +%T): $line" >> "$state/plan.log"
    t0=$SECONDS
    OUT=$out bash -c "$line" > "$state/step$i.log" 2>&1 < /dev/null
    echo "[plan] step $i/$n rc $? in $((SECONDS - t0)) s" >> "$state/plan.log"
  done < <(steps)
  echo "[plan] done $(date +%T)" >> "$state/plan.log"
  echo 0 > "$state/rc"
  ;;
wait)
  wait_done "$state"
  cat "$state/plan.log"
  last=$(ls -t "$state"/step*.log 2>/dev/null | head -n 1)
  [ -n "$last" ] && { echo "== $last"; grep -E "^\[" "$last" | tail -n 6 | cut -c1-220; }
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
  keep && [ -d "$OUT/keep" ] && echo "kept: $(find "$OUT/keep" -type f | wc -l) files"
  [ -f "$state/rc" ] && echo "plan done" || echo "still running"
  ;;
collect)
  mkdir -p "$OUT/plan" && cp -r "$state/out/." "$OUT/plan/" 2>/dev/null
  cp "$state"/*.log "$state/plan.txt" "$OUT/plan/" 2>/dev/null
  keep
  ls -R "$OUT/plan" | head -40
  ;;
esac
