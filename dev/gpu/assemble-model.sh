#!/usr/bin/env bash
# Join the carried chunks of a real model (in /root/m; any count: with the records the checkout
# outgrew 64 MiB beside a 47 MiB chunk, so they may be split finer) and check the SHA-256; MODEL=coder-1.5b
# for Qwen2.5-Coder-1.5B-Instruct (chunks part15.NN), else the 0.5B (part.NN).
set -euo pipefail
if [ "${MODEL:-coder-0.5b}" = coder-1.5b ]; then
  want=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
  name=qwen2.5-coder-1.5b-instruct.gguf parts='/root/m/part15.[0-9][0-9]'
else
  want=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  name=qwen2.5-coder-0.5b-instruct.gguf parts='/root/m/part.[0-9][0-9]'
fi
out=/root/m/$name
# shellcheck disable=SC2086  # $parts is a glob
if [ ! -f "$out" ]; then cat $parts > "$out.partial" && mv "$out.partial" "$out"; fi
got=$(sha256sum "$out" | cut -d' ' -f1)
[ "$got" = "$want" ] || { echo "sha256 mismatch: $got" >&2; exit 1; }
mkdir -p .cache/real && ln -sf "$out" ".cache/real/$name"
echo "model ok: $out"
