#!/usr/bin/env bash
# GPU calls: NVIDIA's Multi-Process Service for the pipeline's GPU rules on one GPU.
# Without it, the processes on a GPU take turns (time slices): a training's short decode
# kernels wait behind an fp32 ablation's (the fifteenth session: the split step 1.50 s beside
# ablate_decompose, 0.59 s alone). Under MPS their kernels share the SMs at once; each kernel
# is the same, so every result must stay bit-identical (verify, the tables).
#   bash dev/gpu/mps.sh start   # the daemon, then a torch and a CuPy kernel through it, else stop
#   bash dev/gpu/mps.sh stop
set -uo pipefail
control=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvidia-log}

case "${1:?start or stop}" in
start)
  [ -x "$control" ] || { echo "[mps] no nvidia-cuda-mps-control: off"; exit 1; }
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  "$control" -d || { echo "[mps] the daemon did not start: off"; exit 1; }
  if timeout 120 python3 -c "
import cupy, torch
x = torch.ones(1 << 20, device='cuda'); y = cupy.ones(1 << 20)
assert float(x.sum()) == float(y.sum()) == 1 << 20
print('[mps] a torch and a CuPy kernel ran')"; then
    echo get_server_list | "$control" | sed 's/^/[mps] server /'
    echo "[mps] on"
  else
    echo quit | "$control"; echo "[mps] a kernel failed through it: off"; exit 1
  fi
  ;;
stop)
  echo quit | "$control" && echo "[mps] off"
  ;;
esac
