"""The split mode's weight sync across two GPUs, timed and checked bit for bit: a trainer on
GPU 0 broadcasts fp32 masters over NCCL (`WeightSender`), a CUDA engine on GPU 1 rounds them
into its buffers (`WeightReceiver`), as rl/split.py does after an update; the engine's fp16
buffers must equal the masters rounded by torch. `python -m ratchet.bench.two_gpus --out sync.json`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from types import SimpleNamespace

import numpy as np
import torch

TRAINER, ENGINE = 0, 1


def _worker(rank: int, rendezvous: str, repeats: int, out_path: str, small: bool) -> None:
    import cupy as cp

    from ratchet.bench.workload import qwen05_config, random_torch_weights
    from ratchet.engine.engine import Engine
    from ratchet.model.layout import expected_shapes, num_parameters
    from ratchet.rl.sync import WeightReceiver, WeightSender
    from ratchet.trainer.policy import Policy

    torch.cuda.set_device(rank)
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    group = torch.distributed.new_group([TRAINER, ENGINE], backend="nccl")
    cfg = qwen05_config()
    if small:  # a test's size: two layers, a small vocabulary
        cfg = dataclasses.replace(cfg, num_layers=2, vocab_size=4096)
    n_params = num_parameters(cfg)
    # Both ranks make the same masters (seeded on the GPU) and move them the same way before
    # each sync, so the engine side knows what it must hold without being sent it twice.
    masters = random_torch_weights(cfg, seed=0)

    def next_update(i: int) -> None:
        with torch.no_grad():
            for w in masters.values():
                w.add_(1e-6 * (i + 1))

    times = torch.zeros(repeats + 2, dtype=torch.float64)
    if rank == TRAINER:
        policy = Policy.from_weights(cfg, masters, device="cuda")  # a copy, on this GPU
        masters = policy.export_weights()  # the live parameters: moving them moves the policy
        sender = WeightSender(policy, group)
        for i in range(repeats + 2):
            next_update(i)
            torch.distributed.barrier()
            torch.cuda.synchronize()
            start = time.perf_counter()
            sender.send(TRAINER)
            torch.cuda.synchronize()
            times[i] = time.perf_counter() - start
        torch.distributed.broadcast(times, src=TRAINER)  # gloo, to the rank that writes the result
    else:
        zeros = {k: np.zeros(s, np.float32) for k, s in expected_shapes(cfg).items()}
        engine = Engine(SimpleNamespace(cfg=cfg, weights=zeros, dtype="fp16"), backend="cuda", max_batch_size=8,
                        max_seq_len=64, device=rank)
        receiver = WeightReceiver(cfg, device="cuda", group=group)
        for i in range(repeats + 2):
            next_update(i)
            torch.distributed.barrier()
            start = time.perf_counter()
            receiver.receive_into(engine, TRAINER)  # returns once the engine's buffers are written
            times[i] = time.perf_counter() - start
        broadcast = torch.zeros_like(times)
        torch.distributed.broadcast(broadcast, src=TRAINER)
        bits = lambda a: np.ascontiguousarray(a).view(np.uint16)  # noqa: E731  (NaN-safe equality)
        mismatched = [k for k, w in masters.items()
                      if not np.array_equal(bits(w.half().cpu().numpy()), bits(cp.asnumpy(engine.backend.weights[k])))]
        sync, broadcast = times[2:].numpy(), broadcast[2:].numpy()
        summary = {
            "what": "split-mode weight sync, trainer on GPU 0 -> engine on GPU 1 (NCCL), fp32 masters "
                    "rounded to fp16 in the engine's buffers; medians after 2 warm-ups",
            "command": "python -m ratchet.bench.two_gpus --out sync.json",
            "params": n_params, "repeats": repeats, "device": torch.cuda.get_device_name(0),
            "gpus": torch.cuda.device_count(),
            "broadcast_ms": 1e3 * float(np.median(broadcast)),
            "sync_ms": 1e3 * float(np.median(sync)),
            "sync_ms_all": [round(1e3 * float(t), 4) for t in sync],
            "broadcast_GBps": n_params * 4 / float(np.median(broadcast)) / 1e9,
            "bit_equal_to_rounded_masters": not mismatched, "mismatched_tensors": mismatched[:5],
        }
        with open(out_path, "w") as f:
            json.dump(summary, f, indent=1)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run(out_path: str, repeats: int = 20, small: bool = False) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    if torch.cuda.device_count() < 2:
        raise RuntimeError(f"the two-GPU sync bench needs two GPUs; this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as tmp:  # torch.distributed's file rendezvous: no port to pick
        mp.spawn(_worker, args=(f"{tmp}/rendezvous", repeats, out_path, small), nprocs=2, join=True)
    with open(out_path) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="sync.json")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(run(args.out, args.repeats), indent=1))


if __name__ == "__main__":
    main()
