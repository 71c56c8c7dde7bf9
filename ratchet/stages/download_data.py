"""download_data: the task's train and test splits as parquet (id, question, answer, target)."""

from __future__ import annotations

from ratchet.data.datasets_io import save_split
from ratchet.paths import RunPaths


def download_data(cfg: dict, run) -> None:
    paths = RunPaths.from_config(cfg)
    d = cfg["data"]
    if d["source"] == "synthetic":
        from ratchet.data.synthetic import make_arithmetic

        s = d["synthetic"]
        train, test = make_arithmetic(s["num_train"], s["num_test"], seed=cfg["seed"],
                                      max_operand=s["max_operand"], op=s["op"])
    elif d["source"] == "hub":
        from ratchet.data.gsm8k import load_gsm8k_hub

        train, test = load_gsm8k_hub(d["repo_id"], d["config_name"], d["revision"])
    else:
        from ratchet.data.gsm8k import load_gsm8k_local

        train, test = load_gsm8k_local(d["train_path"], d["test_path"])
    paths.data.mkdir(parents=True, exist_ok=True)
    save_split(train, paths.train_data)
    save_split(test, paths.test_data)
    print(f"[download_data] {d['source']}: {len(train)} train, {len(test)} test problems "
          f"-> {paths.data}")
    run.log_metrics({"data/num_train": len(train), "data/num_test": len(test)})
    for p in (paths.train_data, paths.test_data):
        run.log_output(p)
