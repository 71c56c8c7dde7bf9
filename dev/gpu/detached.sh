# Sourced by the GPU scripts whose job outlasts one device call (10 minutes): the inputs put
# in place, the job started detached (setsid outlives the call), timed, and polled by later
# calls. Sourced by most scripts beside it.

inputs_in_place() {  # the real model from its carried chunks; GSM8K (carried as .cache/gsm8k) where config/local.yaml reads it
  [ -n "${NO_MODEL:-}" ] || bash dev/gpu/assemble-model.sh || return 1  # NO_MODEL=1: random weights only
  if [ -d .cache/gsm8k ]; then mkdir -p /root/data && cp -r .cache/gsm8k /root/data/; fi
  mkdir -p ../shared/data && ln -sfn /root/data/gsm8k ../shared/data/gsm8k
}

start_detached() {  # STATE SCRIPT: a fresh STATE folder, then `bash SCRIPT run` in its own session
  rm -rf "$1" && mkdir -p "$1"
  setsid nohup bash "$2" run > "$1/run.log" 2>&1 < /dev/null &
}

run_timed() {  # STATE COMMAND...: the output to STATE/snakemake.log, then STATE/wall_s and STATE/rc
  local state=$1 t0 rc
  shift
  t0=$(date +%s.%N)
  "$@" > "$state/snakemake.log" 2>&1
  rc=$?
  python3 -c "print($(date +%s.%N) - $t0)" > "$state/wall_s"
  echo "$rc" > "$state/rc"
}

wait_done() {  # STATE: until STATE/rc exists, at most WAIT_S seconds (default 540)
  # No STATE: this is a fresh machine (the last was given back, 30 s after a call, and the
  # detached job with it). Say so at once: in the tenth session a poll waited out its 310 s on
  # an empty machine.
  [ -d "$1" ] || { echo "no $1 here: a fresh machine, the run is lost (start it again)"; return 3; }
  local end=$((SECONDS + ${WAIT_S:-540}))
  while [ ! -f "$1/rc" ] && [ $SECONDS -lt $end ]; do sleep 5; done
}
