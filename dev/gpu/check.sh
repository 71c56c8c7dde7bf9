#!/usr/bin/env bash
# GPU call 1: the environment, the GPU test suite and the bench; results under $OUT.
set -uo pipefail
source dev/gpu/env.sh
mkdir -p /root/data && cp -r .cache/gsm8k /root/data/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/smi.txt"
python3 -c "import snakemake, mlflow, gguf, jsonschema; print('wheels ok')"
python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_cuda_engine.py 2>&1 | tee "$OUT/pytest.txt" | tail -40
python3 -m ratchet.bench --out "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
python3 -c "import json; print(json.dumps(json.load(open('$OUT/bench.json'))['headline'], indent=1))"
