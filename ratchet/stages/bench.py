"""bench: the CUDA engine beside HF transformers, save-and-reload and sort-based sampling,
on Qwen2.5-0.5B shapes with random weights (not part of `all`: it measures, it makes nothing
the study needs). Writes results/<run>/bench/bench.json and the headline figures."""

from __future__ import annotations

import json

from ratchet.atomic import write_json
from ratchet.device import cuda_available, describe
from ratchet.paths import RunPaths
from ratchet.tracking import code_version


def bench(cfg: dict, run) -> None:
    if not cuda_available():
        raise RuntimeError("bench: needs a CUDA GPU through CuPy (it measures the CUDA engine)")
    from ratchet.bench.headline import headline
    from ratchet.bench.run import bench as run_bench

    results = run_bench(dtype=cfg["engine"]["dtype"])
    results["headline"] = headline(results)
    results["commit"] = code_version()
    results["device"] = describe()
    out = RunPaths.from_config(cfg).bench
    write_json(out, results)
    run.log_metrics({f"bench/{k}": v for k, v in results["headline"].items() if v is not None})
    run.log_output(out)
    print(json.dumps(results["headline"], indent=2))
