#!/usr/bin/env bash
# Join the carried chunks of the real model (in /root/m) and check the SHA-256.
set -euo pipefail
want=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
out=/root/m/qwen2.5-coder-0.5b-instruct.gguf
if [ ! -f "$out" ]; then cat /root/m/part.0? > "$out.partial" && mv "$out.partial" "$out"; fi
got=$(sha256sum "$out" | cut -d' ' -f1)
[ "$got" = "$want" ] || { echo "sha256 mismatch: $got" >&2; exit 1; }
mkdir -p .cache/real && ln -sf "$out" .cache/real/qwen2.5-coder-0.5b-instruct.gguf
echo "model ok: $out"
