#!/usr/bin/env bash
# A stand-in for a cluster's submit command: starts the job script in an empty environment
# (only PATH and HOME, as a batch node would), in the background, and prints its pid as the
# job id. Snakemake's cluster-generic executor then waits for the job's finished marker.
set -euo pipefail
jobscript="$1"
# RATCHET_TRACKING, the one switch a user sets for a whole run, goes through when it is set.
env -i PATH="/usr/local/bin:/usr/bin:/bin" HOME="$HOME" ${RATCHET_TRACKING:+RATCHET_TRACKING="$RATCHET_TRACKING"} \
  bash "$jobscript" > "$jobscript.out" 2>&1 &
echo $!
