"""dev.saved_activations: its linear model of what a trainer pass saves is exact away from the
counts it was fitted on, and checkpointing keeps less."""

from __future__ import annotations

import pytest

from dev.saved_activations import fit, predict, saved_bytes
from ratchet.model.config import ModelConfig

CFG = ModelConfig(arch="qwen2", vocab_size=96, hidden_size=64, intermediate_size=160, num_layers=3,
                  num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, tie_word_embeddings=False)


@pytest.mark.parametrize("compute_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_fit_predicts_an_unseen_layer_and_token_count(compute_dtype, checkpointing):
    coef = fit(CFG, compute_dtype, checkpointing)
    assert predict(coef, 3, 1024) == pytest.approx(saved_bytes(CFG, 1024, compute_dtype, checkpointing), abs=1)


def test_checkpointing_saves_less_by_more_than_the_layers_it_keeps():
    plain, ckpt = (predict(fit(CFG, "fp32", c), 3, 1024) for c in (False, True))
    layer_inputs = 3 * 1024 * CFG.hidden_size * 4  # what checkpointing keeps: each layer's fp32 input
    assert ckpt < plain - layer_inputs


def test_the_command_reads_a_converted_model(tmp_path, prepare, capsys):
    import json

    from dev.saved_activations import main
    from ratchet.paths import RunPaths

    cfg = prepare(tmp_path / "results")
    capsys.readouterr()  # what preparing printed
    main(["--model", str(RunPaths.from_config(cfg).model), "--tokens", "512", "--compute-dtype", "fp32"])
    got = json.loads(capsys.readouterr().out)["saved_gib"]["512"]  # stdout is the JSON alone
    assert got["plain"] > got["checkpointed_with_one_layer_recomputed"] > got["checkpointed"] > 0
