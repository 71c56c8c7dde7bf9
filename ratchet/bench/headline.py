"""The figures the issues track, flattened from a full `bench()` result; plain Python, so
records can be written from results fetched off the GPU machine."""

from __future__ import annotations


def headline(results: dict) -> dict:
    """The figures the issue tracks (medians), flat, from a full `bench()` result."""
    def get(section, key, inner=None):
        value = results.get(section, {}).get(key)
        if inner is not None:
            value = value.get(inner) if isinstance(value, dict) else None
        return float(value) if isinstance(value, (int, float)) else None

    out = {
        # the engine's step: overlapped (the next step launched before this one's tokens are read)
        "decode_ms_per_step_b64": get("decode", "step_ms_median (wall, overlapped as the engine runs)"),
        "decode_ms_per_step_b64_plain": get("decode", "step_ms_median (wall, decode_sample)"),
        "decode_graph_replay_ms_b64": get("decode", "step_ms_graph_replay (ctx 384)"),
        "decode_bandwidth_TBps_b64": get("decode", "bandwidth_TBps (replay, last ctx)"),
        "hf_ms_per_step_b64": get("hf", "step_ms"),
        "decode_tok_per_s_b512": get("throughput", "tokens_per_s (decode)"),
        # the sync as training calls it (FlatWeights: one buffer), and from a mapping of views
        "sync_ms": None if get("sync", "inplace_flat_s") is None else 1e3 * get("sync", "inplace_flat_s"),
        "sync_mapping_ms": None if get("sync", "inplace_s") is None else 1e3 * get("sync", "inplace_s"),
        "save_reload_ms": None if get("sync", "reload_total_s") is None
        else 1e3 * get("sync", "reload_total_s"),
        "sync_events_ms": get("sync", "inplace_flat_events_ms (update_weights call, FlatWeights, GPU clock)"),
        "sync_kernel_ms": get("sync", "kernels_alone_ms", "convert_tiles, 2 loads"),
        "torch_copy_kernel_ms": get("sync", "kernels_alone_ms", "torch_flat_copy"),
        "sampler_ms": get("sampler", "ours_ms_in_graph"),  # GPU time a launch, as in the decode graph
        "sampler_ms_python_launch": get("sampler", "ours_ms"),
        "sampler_ms_back_to_back": get("sampler", "ours_ms_back_to_back"),
        "torch_sort_sampler_ms": get("sampler", "torch_top_p_sort_ms"),
        "telemetry_trainer_ms": None if get("telemetry", "trainer_s_median") is None
        else 1e3 * get("telemetry", "trainer_s_median"),
        "telemetry_engine_ms": None if get("telemetry", "engine_s_median") is None
        else 1e3 * get("telemetry", "engine_s_median"),
    }
    if out["decode_ms_per_step_b64"] and out["hf_ms_per_step_b64"]:
        out["decode_speedup_vs_hf_b64"] = out["hf_ms_per_step_b64"] / out["decode_ms_per_step_b64"]
    return out
