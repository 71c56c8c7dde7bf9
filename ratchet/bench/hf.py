"""The reference: HF transformers `generate` on the same shapes (Qwen2ForCausalLM, random
init, fp16), ms per step from (t(n new) - t(1 new)) / (n - 1)."""

from __future__ import annotations

import time


def bench_hf(batch=64, prompt_len=128, new_tokens=32, seed=0) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.float16).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device="cuda")
    mask = torch.ones_like(ids)

    def gen(n, model=model):  # bound here: `del model` below ends the function's own name
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        assert out.shape[1] == prompt_len + n, out.shape
        return time.perf_counter() - t

    gen(2)  # warm-up
    t1 = [gen(1) for _ in range(2)]
    tn = gen(new_tokens)
    step_ms = 1e3 * (tn - min(t1)) / (new_tokens - 1)
    del model
    torch.cuda.empty_cache()
    return {"batch": batch, "new_tokens": new_tokens, "generate_1_s": min(t1), f"generate_{new_tokens}_s": tn,
            "step_ms": step_ms, "tokens_per_s": batch * 1e3 / step_ms}
