"""The peer's GRPO step: TRL's `GRPOTrainer` with vLLM in colocate mode on the same converted
model, prompts and settings as ratchet's step (8 problems x 8 answers, 384 new tokens, lr 1e-6,
temperature 1, no KL, micro-batches of 8 and one AdamW step per 64 answers, fp32 weights with
bf16 autocast), timed per optimiser step by a callback; medians over steps 2 on.

    python -m dev.trl_grpo --config config/local.yaml --steps 20 --out trl.json

What TRL needs here (dev/gpu/trl.sh): trl 1.16 and datasets in the wheelhouse, vLLM's
in-process settings, and torch.distributed's single-process variables (RANK=0 ...). The
model goes to TRL as a Hugging Face directory exported from the engine's converted weights
(fp32), each prompt as the text of ratchet's own prompt tokens (the chat template applied).
TRL's defaults stay where ratchet has no counterpart (its loss normalisation, its importance
sampling correction against vLLM's log-probabilities): the step a TRL user runs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SINGLE_PROCESS = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": "29533"}


def trl_inputs(cfg: dict, out_dir: Path):
    """(HF model directory, training problems as TRL rows, the study's GRPO settings)."""
    from dev.grpo_step import prepare
    from ratchet.data.datasets_io import load_split
    from ratchet.data.prompts import make_prompt_fn
    from ratchet.data.tokenizer import load_tokenizer
    from ratchet.model.export_hf import export_hf
    from ratchet.model.io import load_engine_model
    from ratchet.paths import RunPaths
    from ratchet.rl.settings import GRPOConfig

    paths = RunPaths.from_config(cfg)
    prepare(cfg)
    model_dir = out_dir / "hf"
    export_hf(load_engine_model(paths.model), model_dir, "fp32", tokenizer_dir=paths.model)
    tokenizer = load_tokenizer(paths.model)
    prompt_fn = make_prompt_fn(tokenizer, cfg["data"]["source"])
    train = load_split(paths.train_data)
    # the prompt as ratchet renders it (chat template applied), given to TRL as plain text
    rows = [{"prompt": tokenizer.decode(prompt_fn(q), skip_special_tokens=False), "target": str(t)}
            for q, t in zip(train["question"], train["target"])]
    return model_dir, rows, GRPOConfig.from_config(cfg)


def gsm8k_reward(completions, target, **kwargs) -> list[float]:
    """ratchet's reward (the exact final answer) on TRL's completions (text or messages)."""
    from ratchet.data.reward import reward

    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [reward(t, tgt) for t, tgt in zip(texts, target)]


def run_trl(config: str, overrides: list[str], steps: int, use_vllm: bool, out_dir: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ratchet import config as config_mod

    for key, value in SINGLE_PROCESS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("RATCHET_TRACKING", "off")
    cfg = config_mod.load(config, overrides)
    model_dir, rows, ours = trl_inputs(cfg, out_dir)
    answers = ours.problems_per_step * ours.group_size
    cuda = torch.cuda.is_available()
    args = GRPOConfig(
        output_dir=str(out_dir / "trl"), max_steps=steps, learning_rate=ours.lr, weight_decay=0.0,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        per_device_train_batch_size=ours.micro_batch_size,
        gradient_accumulation_steps=answers // ours.micro_batch_size,  # one AdamW step per 64 answers
        num_generations=ours.group_size, max_completion_length=ours.max_new_tokens,
        temperature=ours.temperature, beta=0.0, epsilon=0.2, seed=cfg["seed"],
        bf16=cuda, model_init_kwargs={"dtype": "float32"}, gradient_checkpointing=False,
        use_vllm=use_vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
        vllm_max_model_length=cfg["engine"]["max_seq_len"], vllm_enable_sleep_mode=False,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, shuffle_dataset=True)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.started, self.steps = None, []

        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.steps.append(time.perf_counter() - self.started)
            print(f"[trl_grpo] step {state.global_step}: {self.steps[-1]:.3f} s", flush=True)

    timer = StepTimer()
    t = time.perf_counter()
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=gsm8k_reward, args=args,
                          train_dataset=Dataset.from_list(rows), callbacks=[timer])
    start_s = time.perf_counter() - t
    t = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t
    logged = [h for h in trainer.state.log_history if "reward" in h]
    timed = timer.steps[2:] if len(timer.steps) > 2 else timer.steps
    import transformers
    import trl

    result = {"steps": len(timer.steps), "step_s_median": float(np.median(timed)), "per_step_s": timer.steps,
              "start_s": start_s, "train_wall_s": wall, "use_vllm": use_vllm, "vllm_mode": "colocate",
              "trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
              "answers_per_step": answers, "micro_batch_size": ours.micro_batch_size,
              "max_completion_length": ours.max_new_tokens, "lr": ours.lr,
              "reward_per_step": [float(h["reward"]) for h in logged],
              "completion_length_per_step": [float(h.get("completions/mean_length", np.nan)) for h in logged]}
    if cuda:
        result["torch_max_reserved_gb"] = torch.cuda.max_memory_reserved() / 2 ** 30
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/local.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-vllm", action="store_true", help="generate with transformers (a CPU smoke run)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child that trains
    args = ap.parse_args(argv)
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_trl(args.config, args.overrides, args.steps, not args.no_vllm, Path(tmp))
        Path(args.out).write_text(json.dumps(result, indent=1))
        return
    cmd = [sys.executable, "-m", "dev.trl_grpo", "--one", "--config", args.config, "--steps", str(args.steps),
           "--out", str(Path(args.out).with_suffix(".part.json"))] + (["--no-vllm"] if args.no_vllm else [])
    for o in args.overrides:
        cmd += ["--set", o]
    from ratchet.gpu_memory import ProcessPeak

    child = subprocess.Popen(cmd)
    memory = ProcessPeak(child.pid, every_s=0.2)
    rc = child.wait()
    peak = memory.stop() or 0.0
    if rc != 0:
        raise SystemExit(f"trl_grpo: the training process failed (exit status {rc})")
    part = Path(args.out).with_suffix(".part.json")
    result = {"config": args.config, "overrides": args.overrides, **json.loads(part.read_text()),
              "peak_gpu_mem_gb": peak}
    part.unlink()
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"[trl_grpo] step {result['step_s_median']:.3f} s (median of steps 3-{result['steps']}), "
          f"peak {peak:.1f} GB", flush=True)


if __name__ == "__main__":
    main()
