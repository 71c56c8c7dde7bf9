"""Config strings never reach a shell unquoted: results_dir and run_name are checked, every
rule quotes its paths, and a results dir with a space works."""

from __future__ import annotations

import pytest
from snakemake_run import run_snakemake

from ratchet.config import ConfigError, validate


@pytest.mark.parametrize("key", ["results_dir", "run_name"])
@pytest.mark.parametrize("value", ["/tmp/x;touch /tmp/PWNED;y", "a$(id)", "a`id`", "a\nb", "tiny\n",
                                   "a|b", "a>b", "a'b", 'a"b', "a&b"])
def test_shell_metacharacters_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        validate({key: value})


def test_ordinary_names_pass():
    cfg = validate({"results_dir": "/tmp/my results/run-1.2", "run_name": "paper_v2.1"})
    assert cfg["results_dir"] == "/tmp/my results/run-1.2"


def test_injection_through_snakemake_config_runs_nothing(tmp_path):
    marker = tmp_path / "PWNED"
    proc = run_snakemake(tmp_path, "--config", f"results_dir=x;touch {marker};y", "--", "download_model")
    assert proc.returncode != 0
    assert "results_dir" in proc.stdout + proc.stderr
    assert not marker.exists()


def test_rule_shells_quote_the_log_path(tmp_path):
    proc = run_snakemake(tmp_path, "-n", "-p", "--config", "results_dir=my results", "--", "download_model")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "> 'my results/tiny/logs/download_model.log'" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_results_dir_with_a_space_runs_a_rule(tmp_path):
    proc = run_snakemake(tmp_path, "--config", "results_dir=my results", "--", "download_model")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "my results" / "tiny"
    assert (run / "source" / "source.json").is_file()
    assert (run / "logs" / "download_model.log").is_file()
    assert not (tmp_path / "my").exists()  # no stray file from an unquoted path
    assert "ratchet: tiny done; results in my results/tiny/" in proc.stdout + proc.stderr
    assert "mlflow ui" not in proc.stdout + proc.stderr  # tracking is off in this test


def test_a_bad_data_file_shows_its_one_line_error_on_the_console(tmp_path):
    from ratchet.model.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "model", vocab_size=32, hidden_size=32, intermediate_size=64,
                            num_layers=1)
    rows = [{"question": f"q{i}", "answer": f"a\n#### {i}"} for i in range(10)] + [{"question": "q10"}]
    bad = tmp_path / "noanswer.jsonl"
    bad.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    good = tmp_path / "test.jsonl"
    good.write_text('{"question": "q", "answer": "a\\n#### 1"}\n')
    proc = run_snakemake(tmp_path, "--config", "set=" + " ".join([
        "run_name=bad", "model.source=local", f"model.path={model}", "data.source=local",
        f"data.train_path={bad}", f"data.test_path={good}"]), "--", "download_data")
    assert proc.returncode != 0
    line = f"ratchet: {bad} line 11: missing column 'answer'"
    assert line in proc.stdout + proc.stderr  # the failed rule's log, shown on the console
    log = (tmp_path / "results" / "bad" / "logs" / "download_data.log").read_text()
    assert log.strip().splitlines()[-1] == line and "Traceback" not in log
