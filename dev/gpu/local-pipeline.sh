#!/usr/bin/env bash
# GPU calls: the local profile end to end, exactly the README's command
#   snakemake --cores all --configfile config/local.yaml
# timed, with GPU memory sampled every second, then gathered into a record.
# A device call lasts at most 10 minutes, so the run is started detached (setsid outlives
# the call) and polled:
#   bash dev/gpu/local-pipeline.sh start     # model + data in place, launch, return
#   bash dev/gpu/local-pipeline.sh wait      # poll up to WAIT_S s (default 540), show progress
#   bash dev/gpu/local-pipeline.sh collect   # the record -> $OUT/<card>-local.tgz (h200-local.tgz)
# (one archive: a call brings back a limited number of files)
# Before: the wheels and data (carry .whl and .cache/gsm8k, `source dev/gpu/env.sh`,
# copy .cache/gsm8k to /root/data/) and the model chunks (/root/m), in calls back to back:
# the machine is given back 30 s after a call, with everything on it. `git rev-parse HEAD >
# .cache/commit` and carry it with `start`, since the machine's copy of .git can be stale.
set -uo pipefail
source dev/gpu/env.sh
source dev/gpu/detached.sh
# PROFILE=local-1.5b for config/local-1.5b.yaml (results/local-1.5b, record <card>-local-1.5b)
# PIPELINE_SET: snakemake's `set=` overrides, e.g. a trainer setting tried before the profile takes it
profile=${PROFILE:-local}
state=/root/pipeline-$profile
# GPU_JOBS: Snakemake's --resources gpu_jobs=N in place of the workflow profile's 2 (how many GPU rules share the GPU)
# GPU_MEM_GIB: --resources gpu_mem_gib=N, the GPU's memory, so that Snakemake starts only the GPU rules that
#   fit beside those running (the profile's gpu_memory_gib; an H200: 140)
# TARGETS: rule names to run instead of `all` (the 1.5B profile in two leases: dev/gpu/plans/issue20-a.txt, -b.txt)
read -ra targets <<< "${TARGETS:-}"
resources=(${GPU_JOBS:+"gpu_jobs=$GPU_JOBS"} ${GPU_MEM_GIB:+"gpu_mem_gib=$GPU_MEM_GIB"})
args=(--cores all --configfile "config/$profile.yaml" ${PIPELINE_SET:+--config "set=$PIPELINE_SET"}
      ${resources[0]:+--resources} "${resources[@]}" ${TARGETS:+--} "${targets[@]}")
command="snakemake --cores all --configfile config/$profile.yaml${PIPELINE_SET:+ --config 'set=$PIPELINE_SET'}${resources[0]:+ --resources ${resources[*]}}${TARGETS:+ -- $TARGETS}"

case "${1:?start, tracking, run, wait or collect}" in
start)
  inputs_in_place || exit 1
  [ "$(bash dev/gpu/local-pipeline.sh tracking | tail -1)" = on ] || export RATCHET_TRACKING=off
  start_detached "$state" dev/gpu/local-pipeline.sh
  sleep 20 && tail -5 "$state/snakemake.log"
  ;;
tracking)  # "on" where MLflow's SQLite store works here (a run and a metric in a scratch store), else "off"
  python3 - <<'PY' 2>&1 | tail -2 && echo on || { echo "MLflow's SQLite store fails here: tracking off"; echo off; }
import tempfile, mlflow
c = mlflow.MlflowClient(f"sqlite:///{tempfile.mkdtemp()}/m.db")
r = c.create_run(c.create_experiment("smoke"))
c.log_metric(r.info.run_id, "x", 1.0, step=1)
print("mlflow sqlite ok")
PY
  ;;
run)
  mkdir -p "$state"
  # whether the GPU rules shared the SMs (NVIDIA MPS, dev/gpu/mps.sh) or took turns: for the record
  # (by its command line: the kernel keeps 15 characters of a name, so -x never matched)
  pgrep -f '^[^ ]*nvidia-cuda-mps-control' > /dev/null && echo true > "$state/mps" || echo false > "$state/mps"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 > "$state/gpu_mem_mib.txt" &
  sampler=$!
  # and how busy the GPU was each second (the share of the last sample period a kernel ran): where
  # the profile leaves the GPU idle, its wall is not its GPU work
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 1000 > "$state/gpu_util_pct.txt" &
  util_sampler=$!
  run_timed "$state" python3 -m snakemake "${args[@]}"
  kill "$sampler" "$util_sampler"
  ;;
wait)
  wait_done "$state" || exit 3
  grep -E "^\[|Finished jobid|Error|error|Exiting" "$state/snakemake.log" | tail -25
  for f in "results/$profile"/logs/*.log; do echo "== $f: $(grep -v '^\s*$' "$f" | tail -1 | cut -c1-240)"; done
  sort -n "$state/gpu_mem_mib.txt" | tail -1 | sed 's/^/peak GPU memory MiB so far: /'
  [ -f "$state/rc" ] && echo "pipeline rc $(cat "$state/rc"), wall $(cat "$state/wall_s") s" || echo "still running"
  bash dev/gpu/local-pipeline.sh collect > /dev/null  # what is done so far, in case the device goes
  ;;
collect)
  # the machine's copy of .git can be stale: carry .cache/commit (git rev-parse HEAD > .cache/commit)
  [ -f .cache/commit ] && export RATCHET_COMMIT=$(cat .cache/commit)
  wall=(); [ -f "$state/wall_s" ] && wall=(--wall-s "$(cat "$state/wall_s")")
  mps=(); [ -f "$state/mps" ] && mps=(--extra "{\"mps\": $(cat "$state/mps")}")
  overrides=(); [ -n "${PIPELINE_SET:-}" ] && read -ra overrides <<< "$PIPELINE_SET"
  # named by the card it ran on (h200, h100): a lease asked for an H200 may get an H100
  smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv)
  card=$(sed -n 2p <<< "$smi" | cut -d, -f1 | grep -oiE 'h[0-9]{3}' | tr 'A-Z' 'a-z')
  record=${card:-gpu}-$profile
  python3 -m dev.record --run "results/$profile" --out "$OUT/$record" "${wall[@]}" \
    --command "$command" --config "config/$profile.yaml" --set "${overrides[@]}" --gpu-samples "$state/gpu_mem_mib.txt" \
    --gpu-util "$state/gpu_util_pct.txt" \
    --snakemake-log "$state/snakemake.log" "${mps[@]}"
  printf '%s\n' "$smi" > "$OUT/$record/nvidia-smi.txt"
  tar czf "$OUT/$record.tgz" -C "$OUT" "$record" && rm -rf "$OUT/$record"
  ;;
esac
