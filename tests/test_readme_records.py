"""The README's figures that come from a committed record agree with it: a rerun that changes
the record fails here until the README says what it now shows."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
REMEDIES = {"no remedy": "none", "TIS (cap 2)": "tis", "MIS ([0.5, 2])": "mis",
            "the fix (rounded weights)": "fix", "the exact fix": "exact"}
ROW = re.compile(r"^\| (?P<label>[^|]+?) \| (?P<dtype>fp16|bf16) \| (?P<rest>.*)\|$")


def _learning_rows() -> dict[tuple[str, str], str]:
    """The README's learning table: (dtype, remedy) -> the rest of its row."""
    text = (ROOT / "README.md").read_text()
    start = text.index("| 100 steps | engine | step 0 |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        m = ROW.match(line)
        if not m:
            break
        rows[(m["dtype"], REMEDIES[m["label"]])] = m["rest"]
    return rows


def test_the_readmes_learning_table_is_the_records():
    record = ROOT / "results/records/h200-learning/learning.parquet"
    if not record.is_file():
        pytest.skip("no learning record")
    runs = pd.read_parquet(record)
    rows = _learning_rows()
    assert set(rows) == {(d, r) for d in ("fp16", "bf16") for r in REMEDIES.values()}
    for r in runs.itertuples():
        cells = [c.strip() for c in rows[(r.dtype, r.remedy)].split("|")]
        gap = "0 (every token, every step)" if r.gap_mean_mean_over_steps == 0 else f"{r.gap_mean_mean_over_steps:.1e}".replace("e-0", "e-")
        assert cells[:4] == [f"{100 * r.baseline_accuracy:.1f}%",
                             f"{100 * r.accuracy:.1f}% ± {100 * r.accuracy_stderr:.1f}",
                             f"{100 * r.gain:+.1f} ± {100 * r.gain_stderr:.1f} pts", gap], (r.dtype, r.remedy)
    for key in set(rows) - {(r.dtype, r.remedy) for r in runs.itertuples()}:  # a run the record lacks
        assert "not run yet" in rows[key], key


def _record(name: str) -> dict:
    import json

    path = ROOT / "results/records" / name
    if not path.is_file():
        pytest.skip(f"no record {name}")
    return json.loads(path.read_text())


def test_the_readmes_sync_and_1_5b_eval_figures_are_the_records():
    text = (ROOT / "README.md").read_text()
    sync = _record("h200-bench-sync-session8.json")
    assert f"**{sync['sync_ms']:.3f} ms wall and {sync['sync_events_ms']:.3f} ms by CUDA events**" in text
    assert f"`convert_tiles` with 2 loads takes {sync['sync_kernel_ms']:.3f} ms" in text
    assert f"torch's flat copy {sync['torch_copy_kernel_ms']:.3f} ms" in text
    ev = _record("h200-eval-1.5b.json")
    engine = f"{100 * ev['engine_accuracy']:.1f}% ± {100 * ev['engine_accuracy_stderr']:.1f}"
    hf = f"{100 * ev['hf_accuracy']:.1f}% ± {100 * ev['hf_accuracy_stderr']:.1f}"
    assert f"| {engine} | {round(ev['engine_tokens_per_s'], -2):,.0f} | {ev['engine_eval_wall_s']:.1f} s |" in text
    assert f"| {hf} | {round(ev['hf_tokens_per_s'], -2):,.0f} | {ev['hf_eval_wall_s']:.0f} s |" in text
    assert f"**{100 * ev['same_verdict_share']:.1f}%** of problems" in text
    paired = ev["engine_minus_hf"]
    assert f"{100 * paired['diff']:.1f} ± {100 * paired['stderr']:.1f} pts ({paired['better']} problems better, {paired['worse']} worse)" in text


def test_the_readmes_step_headline_is_the_records_same_call_pair():
    text = (ROOT / "README.md").read_text()
    rec = _record("h200-grpo-step.json")
    speedup = rec["trl_vllm_step_s_median"] / rec["ratchet_step_s_median"]
    assert abs(speedup - rec["speedup_vs_trl_vllm"]) < 1e-9
    assert (f"the GRPO step is {speedup:.1f}x TRL 1.16 with vLLM colocated\n"
            f"({rec['ratchet_step_s_median']:.2f} s against {rec['trl_vllm_step_s_median']:.2f} s") in text
    assert f"**{rec['ratchet_step_s_median']:.3f} s** against TRL's **{rec['trl_vllm_step_s_median']:.2f} s: " \
           f"{speedup:.1f}x**" in text


def test_the_readmes_vllm_rows_at_larger_shapes_are_the_records():
    text = (ROOT / "README.md").read_text()
    beside = _record("h200-bench-1.5b.json")["vllm_beside"]
    rows = [("Coder-1.5B, B = 64", beside, "b64"), ("Coder-1.5B, B = 512", beside, "b512"),
            ("7B, B = 64", beside["qwen2.5_7b"], "b64"), ("7B, B = 256", beside["qwen2.5_7b"], "b256")]
    for label, rec, b in rows:
        ours, seeded, unseeded = (rec[f"{b}_{k}_ms"] for k in ("ratchet", "vllm_seeded", "vllm_unseeded"))
        cells = [f"{x:.3g} ms" if x < 10 else f"{x:.1f} ms" for x in (ours, seeded, unseeded)]
        assert f"| {label} | {' | '.join(cells)} | {seeded / ours:.2g}x |" in text, label


def test_the_readmes_larger_shapes_table_is_the_records_summary():
    text = (ROOT / "README.md").read_text()
    summary = _record("h200-bench-1.5b.json")["summary"]
    for label, key in (("Qwen2.5-Coder-1.5B (1.78B parameters, untied output)", "coder_1.5b"),
                       ("Qwen2.5-7B (28 layers, hidden 3584, 28/4 heads)", "qwen2.5_7b")):
        s = summary[key]
        row = f"| {label} | {s['decode_ms_per_step_b64']:.2f} ms"
        share = f"| {s['roofline_ms_b64']:.2f} ms | **{100 * s['roofline_share_b64']:.0f}%** |"
        line = next((ln for ln in text.splitlines() if ln.startswith(row)), None)
        assert line is not None and share in line, key


def test_the_readmes_1_5b_study_is_its_record():
    import json

    record = ROOT / "results/records/h200-local-1.5b"
    if not (record / "summary.json").is_file():
        pytest.skip("no 1.5B record")
    s = json.loads((record / "summary.json").read_text())
    text = (ROOT / "README.md").read_text()
    assert s["complete"] and s["repro_identical"]
    assert f"`wall_s` is their sum, **{s['wall_s']:,.1f} s ({s['wall_s'] / 60:.1f} min)**" in text

    def acc(key):
        return f"{100 * s[key]:.1f}% ± {100 * s[key.replace('accuracy', 'accuracy_stderr')]:.1f}"

    cells = [acc("baseline_accuracy")]
    for mode in ("colocated", "split"):
        g = s[f"gain_{mode}"]
        cells.append(f"{acc(f'after_accuracy_{mode}')} (**{100 * g['gain']:+.1f} ± {100 * g['gain_stderr']:.1f}**, "
                     f"{g['improved']}")
    line = next(ln for ln in text.splitlines() if ln.startswith("| Coder-1.5B | "))
    for cell in cells:
        assert cell in line, cell
    decompose = pd.read_parquet(record / "ablate/decompose.parquet")
    exact = decompose[decompose["source"] == "exact"]
    assert exact["abs_diff_max"].max() == 0
    assert f"exact fix leaves 0 on all {exact['num_tokens'].sum():,} measured tokens" in text


def _peak(log: Path) -> str:
    """'63.8 GiB': a rule log's peak line, read as dev.record reads it."""
    from dev.record import PEAK

    found = PEAK.search(log.read_text())
    assert found, log
    return f"{float(found.group(2)):.1f} GiB"


def test_the_readmes_1_5b_memory_table_is_the_profile_and_the_records():
    """Each row of "Time and memory, as the profile stands": the stated figure is the profile's,
    and the measured peak and time come from the rule's own log in the record it names."""
    import yaml

    text = (ROOT / "README.md").read_text()
    start = text.index("#### Time and memory, as the profile stands")
    rows = {}
    for line in text[start:].splitlines():
        if line.startswith("| `") or line.startswith("| each eval"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
        elif rows and not line.startswith("|"):
            break
    stated = yaml.safe_load((ROOT / "config/local-1.5b.yaml").read_text())["gpu_memory_gib"]
    for label, rule in (("`train_colocated`", "train_colocated"), ("`train_split`", "train_split"),
                        ("`ablate_fix_run` (five runs)", "ablate_fix_run"),
                        ("`ablate_decompose`", "ablate_decompose"), ("`verify`", "verify"),
                        ("`build_engine`", "build_engine"), ("each eval", "default")):
        assert rows[label][0] == f"{stated[rule]} GiB", label
    records = ROOT / "results/records"
    run_in, done_in = r"its runs? in (\d+\.\d) s", r"done in (\d+\.\d) s"
    logs = {  # label -> (log, the pattern of its time alone in the log, or None where the row gives another's)
        "`train_colocated`": (records / "h100-1.5b-train-memory/colocated-checkpointing/train_colocated.log", None),
        "`train_split`": (records / "h100-1.5b-verify-recompute/train-split-100/train_split.log", done_in),
        "`ablate_fix_run` (five runs)": (records / "h100-1.5b-ablate-fix-release-session38/logs/ablate_fix_run-all.log", run_in),
        "`ablate_decompose`": (records / "h100-1.5b-decompose-steps-released/logs/ablate_decompose.log", run_in),
        "`verify`": (records / "h100-1.5b-verify-recompute/logs/verify.log", done_in),
        "`build_engine`": (records / "h200-local-1.5b/logs/build_engine.log", None),
        "each eval": (records / "h200-local-1.5b/logs/eval_baseline.log", None),
    }
    for label, (log, took_pattern) in logs.items():
        if not log.is_file():
            pytest.skip(f"no record {log}")
        assert rows[label][1].startswith(_peak(log)), label
        if took_pattern:
            took = re.search(took_pattern, log.read_text())[1]
            assert rows[label][2].startswith(f"{took} s"), label
    held = records / "h200-local-1.5b/session36-decompose-gradients-at-once-1/logs/ablate_decompose.log"
    if held.is_file():  # ablate_decompose's H200 measurement, every engine held through the passes
        took = re.search(r"its run in (\d+\.\d) s", held.read_text())[1]
        assert f"{_peak(held)} (H200, every engine held)" in rows["`ablate_decompose`"][1]
        assert f"{took} s (H200, every engine held)" in rows["`ablate_decompose`"][2]
