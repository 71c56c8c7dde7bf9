"""The bench's B = 64 decode figures and the attention kernel's time a step, one line, for
A/B runs of kernel directories (RATCHET_KERNEL_DIR=... python3 tools/gpu/decode_ab.py LABEL)."""

from __future__ import annotations

import sys

from ratchet.engine.cuda.bench import bench

if __name__ == "__main__":
    res = bench(sections=("decode", "profile"))
    d, p = res["decode"], res["profile"]
    attn = sum(us for name, us, _ in p["kernels (name, us/step, launches/step)"] if "attn_decode" in name)
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    print(f"AB {label:10s} wall plain {d['step_ms_median (wall, decode_sample)']:.4f} ms, "
          f"overlapped {d['step_ms_median (wall, overlapped as the engine runs)']:.4f} ms "
          f"(tokens equal: {d['overlapped_tokens_equal']}), replay {d['step_ms_graph_replay (ctx 384)']:.4f} ms, "
          f"kernels {p['kernel_us_per_step_total']:.1f} us, attention {attn:.1f} us", flush=True)
