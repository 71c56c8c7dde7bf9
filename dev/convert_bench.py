"""Time convert_gguf (the dequantisation and fusion of convert_weights, no file written) on a
GGUF file, each repeat in a fresh process (a cold page cache is not asked for), and print the
median as JSON. Run it in two checkouts to compare commits:
    python -m dev.convert_bench .cache/real/qwen2.5-coder-0.5b-instruct.gguf --repeat 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

ONE = """
import tempfile, time
from {module} import convert_gguf
t = time.perf_counter()
convert_gguf({path!r}, tempfile.mkdtemp())
print(time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--module", default="ratchet.model.convert_gguf",
                    help="where convert_gguf comes from: an earlier commit's file, put on PYTHONPATH, "
                         "to time both in one call")
    args = ap.parse_args()
    times = []
    for _ in range(args.repeat):
        out = subprocess.run([sys.executable, "-c", ONE.format(path=args.gguf, module=args.module)], capture_output=True,
                             text=True, check=True).stdout
        times.append(float(out.strip().splitlines()[-1]))
    print(json.dumps({"gguf": args.gguf, "module": args.module, "seconds": [round(t, 2) for t in times],
                      "median_s": round(statistics.median(times), 2)}))


if __name__ == "__main__":
    main()
