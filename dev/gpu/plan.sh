#!/usr/bin/env bash
# GPU calls: a session's GPU work as one queue, run one step after another by a detached job,
# so that the machine does not idle between calls and no two jobs fight for its memory (two
# ablations beside a training ran the GPU out of memory). A plan is a file of steps, one shell
# command a line (# comments, blank lines skipped), each with its own $OUT under the plan's state:
#   bash dev/gpu/plan.sh start dev/gpu/plans/NAME.txt > /root/plan-start.log 2>&1 < /dev/null
#     (never into a pipe: the detached runner inherits it, and the call waits for it to its timeout)
#   bash dev/gpu/plan.sh wait       # poll up to WAIT_S s (default 540): each step's state, newest lines
#   bash dev/gpu/plan.sh collect    # every step's $OUT so far -> $OUT/plan.tgz (stepN/...), with the plan's log
# The steps run in a copy of the checkout ($state/repo): every device call rewrites the checkout
# first, and a file rewritten under a running step broke it (NVRTC could not open a kernel
# header mid-compile); the copy also keeps local edits made meanwhile out of the running plan.
# Look for a step's files there, not in the checkout.
# A line `#keep GLOB` (a path under the repo) names results a step writes as it goes, such as
# each finished learning run: every `wait` brings back what exists of them as $OUT/keep.tgz (one
# file: the device returns nothing more than two folders down), so a machine taken back mid-step
# loses only the unfinished part. Poll with calls back to back: the machine goes back 30 s after
# a call, and the detached job with it.
# A failing step is recorded (its rc; a pipeline's is its first failing command's, so `cmd | tail`
# fails when cmd does) and the next one starts. Before: the inputs the steps need
# in place (wheels, data, model chunks; dev/gpu/assemble-model.sh runs on start).
set -uo pipefail
source dev/gpu/env.sh
source dev/gpu/detached.sh
state=${PLAN_STATE:-/root/plan}

steps() {  # the plan's commands, one a line
  grep -vE '^\s*(#|$)' "$state/plan.txt"
}

workdir() {  # where the steps run: the plan's copy of the checkout (start makes it), else here
  if [ -d "$state/repo" ]; then echo "$state/repo"; else pwd; fi
}

keep() {  # what the #keep lines name, as $OUT/keep.tgz with their paths
  local glob f files=()
  while read -r glob; do
    # shellcheck disable=SC2086  # the glob is meant to expand
    for f in $glob; do [ -f "$f" ] && files+=("$f"); done
  done < <(grep -E '^#keep ' "$state/plan.txt" 2>/dev/null | cut -d' ' -f2-)
  [ ${#files[@]} -gt 0 ] && tar czf "$OUT/keep.tgz" "${files[@]}" && echo "kept: ${#files[@]} files"
}

case "${1:?start, wait or collect}" in
start)
  plan=${2:?a plan file}
  [ -f "$plan" ] || { echo "no plan file $plan"; exit 1; }
  inputs_in_place || exit 1
  export RATCHET_TRACKING=${RATCHET_TRACKING:-off}
  # a plan started again: stop the earlier runner and its step first (setsid made it a process group
  # leader), else it goes on writing its steps' lines and its "done" into the new plan's state
  if [ -f "$state/runner.pid" ] && kill -0 "$(cat "$state/runner.pid")" 2>/dev/null; then
    kill -- "-$(cat "$state/runner.pid")" 2>/dev/null; sleep 2
  fi
  rm -rf "$state" && mkdir -p "$state/repo" "$state/shared/data" && cp "$plan" "$state/plan.txt"
  cp -a . "$state/repo/" && ln -sfn /root/data/gsm8k "$state/shared/data/gsm8k"  # ../shared from the copy
  (cd "$state/repo" && PLAN_STATE=$state setsid nohup bash dev/gpu/plan.sh run > "$state/run.log" 2>&1 < /dev/null &)
  sleep "${START_WAIT_S:-10}"; tail -n 3 "$state/plan.log" 2>/dev/null || echo "[plan] started"
  ;;
run)
  echo $$ > "$state/runner.pid"
  n=$(steps | wc -l) i=0
  while IFS= read -r line; do
    i=$((i + 1)) && out="$state/out/step$i" && mkdir -p "$out"
    echo "[plan] step $i/$n start $(date +%T): $line" >> "$state/plan.log"
    t0=$SECONDS
    OUT=$out bash -o pipefail -c "$line" > "$state/step$i.log" 2>&1 < /dev/null
    echo "[plan] step $i/$n rc $? in $((SECONDS - t0)) s" >> "$state/plan.log"
  done < <(steps)
  echo "[plan] done $(date +%T)" >> "$state/plan.log"
  echo 0 > "$state/rc"
  ;;
wait)
  wait_done "$state" || exit 3
  cat "$state/plan.log"
  last=$(ls -t "$state"/step*.log 2>/dev/null | head -n 1)
  [ -n "$last" ] && { echo "== $last"; grep -E "^\[" "$last" | tail -n 6 | cut -c1-220; }
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
  (cd "$(workdir)" && keep)
  [ -f "$state/rc" ] && echo "plan done" || echo "still running"
  ;;
collect)
  # one archive: the device returns a limited number of files a call (a folder of every step's
  # outputs was refused, "count"), and nothing deeper than two folders
  (cd "$state" && tar czf "$OUT/plan.tgz" --transform 's,^out/,,' out plan.txt ./*.log 2>/dev/null)
  (cd "$(workdir)" && keep)
  tar tzf "$OUT/plan.tgz" | head -40
  ;;
esac
