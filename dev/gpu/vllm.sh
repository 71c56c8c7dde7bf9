#!/usr/bin/env bash
# GPU calls: install vLLM 0.26.0 from the wheelhouse and run the vLLM engine's GPU tests
# (tests/test_vllm_gpu.py: log-probs of every sampled token against ratchet's own engine,
# resume after cancel, greedy answers, a weight update seen in the next sample and in the
# checksums). All calls on the same machine (what lies in /root/v and /tmp/vsite goes with it).
#
# Here, once (pip download from PyPI, 355 MiB):
#   ../shared/tools/vllm-wheels.sh .cache/vllm      # vllm.tar.00..06 (55 MiB each) + SHA256
#   (cd .cache/vllm && cat vllm.tar.0? > t && rm vllm.tar.0? && split -b 42M -d t vllm.tar. && rm t)
#   # 55 MiB chunks and the 12 MiB checkout exceed a call's 64 MiB: nine chunks of 42 MiB
# There, one chunk a call (a call carries at most 64 MiB), carry=[".cache/vllm/vllm.tar.0N"]:
#   bash dev/gpu/vllm.sh stage           # moves the carried chunk (and SHA256) into /root/v
# then, carry=[".cache/vllm/SHA256"] or nothing:
#   bash dev/gpu/vllm.sh install         # join, sha256sum -c, untar, pip install --target /tmp/vsite
#   bash dev/gpu/vllm.sh test            # pytest -m gpu tests/test_vllm_gpu.py (~140 s of start-up)
# and, with the model chunks assembled (dev/gpu/assemble-model.sh) and .cache/gsm8k carried:
#   bash dev/gpu/vllm.sh bench           # python -m ratchet.bench.vs_vllm (h200-vllm.json)
#   bash dev/gpu/vllm.sh shapes          # the same decode at 1.5B and 7B shapes, random weights
#   ONLY_SHAPE=qwen2.5-7b bash dev/gpu/vllm.sh shapes                 # one of them
#   bash dev/gpu/vllm.sh decompose 'ablate.engine_dtypes=[fp16]'   # ablate_decompose_vllm
#   RUN=local-bf16 bash dev/gpu/vllm.sh decompose 'ablate.engine_dtypes=[bf16]'
#   VARIANTS=split:fp16 GRPO_SET='train.micro_batch_size=64 train.attention=causal' bash dev/gpu/vllm.sh trl
#                                        # dev.trl_grpo (TRL + vLLM), then dev.grpo_step, one call
set -euo pipefail
source dev/gpu/env.sh
v=/root/v site=/tmp/vsite
mkdir -p "$v"
# vLLM in-process: its engine subprocess and V2 model runner hung at start-up on this machine
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_V2_MODEL_RUNNER=0 VLLM_HOST_IP=127.0.0.1 \
       VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$site:$PYTHONPATH"  # vLLM's own folder first: not the project's wheels

case "${1:?stage, install or test}" in
stage)
  shopt -s nullglob
  for f in .cache/vllm/vllm.tar.0? .cache/vllm/SHA256*; do mv -v "$f" "$v/"; done  # SHA256 rides with one chunk
  ls -l "$v"
  ;;
install)
  [ -f "$site/.installed" ] && { echo "vLLM already in $site"; exit 0; }
  [ -f .cache/vllm/SHA256 ] && cp .cache/vllm/SHA256 "$v/"
  n=$(ls "$v"/vllm.tar.0? | wc -l)  # however the tar was cut: the checksum of the joined chunks decides
  cd "$v" && cat vllm.tar.0? > vllm.tar && { sha256sum -c SHA256 || { echo "the $n chunks in $v do not join to vllm.tar: stage the others"; exit 1; }; }
  mkdir -p w && tar xf vllm.tar -C w
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" w/*.whl
  rm -f vllm.tar && touch "$site/.installed"
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.is_available())"
  ;;
test)
  python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_vllm_gpu.py "${@:2}"
  ;;
shapes)  # decode beside vLLM on random weights at Coder-1.5B's and 7B's shapes (no model files);
  # ONLY_SHAPE=qwen2.5-7b for one of them
  mkdir -p "$OUT/vllm" && export RATCHET_TRACKING=off && rc=0
  for run in "qwen2.5-coder-1.5b 64,512" "qwen2.5-7b 64,256"; do
    # shellcheck disable=SC2086  # a shape and its batches
    set -- $run
    [ -n "${ONLY_SHAPE:-}" ] && [ "$1" != "$ONLY_SHAPE" ] && continue
    python3 -m ratchet.bench.vs_vllm --shape "$1" --batches "$2" --out "$OUT/vllm/h200-vllm-$1.json" \
      > "$OUT/vllm/vs_vllm-$1.txt" 2>&1 || rc=1
    grep "^\[vs_vllm\]" "$OUT/vllm/vs_vllm-$1.txt" || true; tail -3 "$OUT/vllm/vs_vllm-$1.txt"
  done
  exit $rc
  ;;
bench)  # ratchet.bench.vs_vllm on the local profile: $OUT/vllm/h200-vllm.json
  source dev/gpu/detached.sh && inputs_in_place || exit 1
  mkdir -p "$OUT/vllm" && export RATCHET_TRACKING=off
  for stage in download_model download_data convert_weights; do  # the bench's inputs, if missing
    python3 -m ratchet "$stage" --config config/local.yaml > /dev/null || exit 1
  done
  python3 -m ratchet.bench.vs_vllm --config config/local.yaml --out "$OUT/vllm/h200-vllm.json" "${@:2}" \
    > "$OUT/vllm/vs_vllm.txt" 2>&1; rc=$?
  grep "^\[vs_vllm\]" "$OUT/vllm/vs_vllm.txt"; tail -5 "$OUT/vllm/vs_vllm.txt"; exit $rc
  ;;
decompose)  # ablate_decompose_vllm on the local profile: $OUT/vllm/<RUN>/decompose_vllm.*
  # one engine dtype a process (one vLLM start); RUN names its results (RUN=local-bf16 with
  # ablate.engine_dtypes=[bf16]); vLLM eager: the trajectory's deterministic mode needs it
  source dev/gpu/detached.sh && inputs_in_place || exit 1
  run=${RUN:-local} && mkdir -p "$OUT/vllm/$run" && export RATCHET_TRACKING=off
  log="$OUT/vllm/$run/decompose_vllm.txt"
  for stage in download_model download_data convert_weights build_engine ablate_decompose_vllm; do
    python3 -m ratchet "$stage" --config config/local.yaml run_name="$run" engine.vllm.enforce_eager=true \
      "${@:2}" >> "$log" 2>&1 || { tail -30 "$log"; exit 1; }
  done
  cp "results/$run/ablate/"decompose_vllm.* "$OUT/vllm/$run/"
  grep "^\[ablate_decompose_vllm\]" "$log" | tail -40
  ;;
trl)  # TRL's GRPOTrainer with vLLM colocated, then ratchet's step, in one call: $OUT/trl/
  source dev/gpu/detached.sh && inputs_in_place || exit 1
  mkdir -p "$OUT/trl" && export RATCHET_TRACKING=off
  python3 -m dev.trl_grpo --config config/local.yaml --steps "${TRL_STEPS:-20}" --out "$OUT/trl/trl.json" \
    > "$OUT/trl/trl.txt" 2>&1 || { tail -40 "$OUT/trl/trl.txt"; }
  grep "^\[trl_grpo\]" "$OUT/trl/trl.txt" | tail -4
  if [ -n "${VARIANTS:-}" ]; then
    sets=()  # GRPO_SET: overrides separated by spaces, each KEY=VALUE without spaces
    for s in ${GRPO_SET:-}; do sets+=(--set "$s"); done
    python3 -m dev.grpo_step --config config/local.yaml --steps "${STEPS:-100}" --variants "$VARIANTS" \
      "${sets[@]}" --out "$OUT/trl/grpo-step.json" > "$OUT/trl/grpo-step.txt" 2>&1
    grep "^\[grpo_step\]" "$OUT/trl/grpo-step.txt"; tail -3 "$OUT/trl/grpo-step.txt"
  fi
  ;;
*)
  echo "unknown step $1 (stage, install, test, bench, decompose or trl)"; exit 2
  ;;
esac
