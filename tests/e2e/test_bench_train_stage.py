"""bench/train_stage.py runs as bench/README.md prints it: the real training stage trains each variant with its
overrides for the asked updates, in alternating order, and the figures are derived from the stage's own
metrics/train.json; a variant that would need other tokenized data, sets what the bench sets, or has an invalid
value exits naming it. The 30-minute budgets of the Multi30k configs rest on this bench."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.artifacts import Paths
from pipeline.params import parse
from stages import tokenize
from tests.conftest import REPO, write_clean_splits

pytestmark = pytest.mark.e2e

PARAMS = {
    "tokenize": {"vocab_size": 500},
    "model": {"preset": "tiny", "d_model": 32, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1,
              "attention_heads": 2},
    "train": {"max_steps": 1000, "valid_every": 10, "save_every": 10, "average_last": 2, "warmup_steps": 5,
              "max_tokens": 512, "valid_bleu_sentences": 8, "precision": "fp32"},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train-stage-run")
    write_clean_splits(root, {"train": 400, "valid": 30})
    tokenize.run(parse(PARAMS), Paths(root))
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS), encoding="utf-8")
    return root


def bench(run: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bench" / "train_stage.py"), "--run", str(run), "--threads", "1",
                           *args], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={"HF_HUB_OFFLINE": "1", "PATH": ""})


def test_each_variant_trains_its_own_model_in_alternating_rounds(run_dir, tmp_path):
    work = tmp_path / "runs"
    result = bench(run_dir, "--updates", "20", "--rounds", "2", "--budget-seconds", "60", "--workdir", str(work),
                   "--variant", "config", "--variant", "wide", "model.d_model=48", "train.lr=0.004")
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["orders"] == [["config", "wide"], ["wide", "config"]]
    config_lr = parse(PARAMS).train.lr
    assert config_lr != 0.004  # so the override changes something
    for name, d_model, lr in (("config", 32, config_lr), ("wide", 48, 0.004)):
        row = figures["variants"][name]
        for round_index in (1, 2):
            folder = work / f"round{round_index}-{name}"
            config = json.loads((folder / "models" / "final" / "config.json").read_text())
            assert config["d_model"] == d_model  # the variant's model, not the run's
            trained = parse(yaml.safe_load((folder / "params.yaml").read_text())).train
            assert (trained.lr, trained.max_steps, trained.threads) == (lr, 20, 1)
            metrics = json.loads((folder / "metrics" / "train.json").read_text())
            assert metrics["steps"] == 20
            assert metrics["train_seconds"] == row["train_seconds"][round_index - 1]  # the stage's own figure
        median = statistics.median(row["train_seconds"])
        assert row["median_seconds"] == round(median, 1)
        assert row["budget_updates"] == int(20 / median * 60)
        base = statistics.median(figures["variants"]["config"]["train_seconds"])
        assert row["speed_vs_baseline"] == round(base / median, 3)
        assert row["baseline_steps_at_speed"] == int(PARAMS["train"]["max_steps"] * base / median)
    assert figures["variants"]["config"]["speed_vs_baseline"] == 1.0
    again = bench(run_dir, "--updates", "20", "--workdir", str(work), "--variant", "config")
    assert again.returncode != 0 and "not empty" in again.stderr and "Traceback" not in again.stderr


def test_processes_share_the_cores_the_bench_is_given(run_dir, tmp_path):
    work = tmp_path / "runs"
    result = bench(run_dir, "--threads", "2", "--updates", "4", "--rounds", "1", "--workdir", str(work),
                   "--variant", "config", "--variant", "ddp", "train.nproc=2", "train.max_tokens=256")
    assert result.returncode == 0, result.stderr[-3000:]
    for name, processes, threads in (("config", 1, 2), ("ddp", 2, 1)):
        trained = parse(yaml.safe_load((work / f"round1-{name}" / "params.yaml").read_text())).train
        assert (trained.nproc, trained.threads) == (processes, threads)
        assert json.loads((work / f"round1-{name}" / "metrics" / "train.json").read_text())["processes"] == processes
    uneven = bench(run_dir, "--threads", "3", "--variant", "config", "--variant", "ddp", "train.nproc=2")
    assert uneven.returncode != 0 and "Traceback" not in uneven.stderr
    assert "--variant ddp: train.nproc=2 processes cannot share --threads 3 evenly" in uneven.stderr


def test_a_baseline_other_than_the_runs_config_has_no_step_budget_to_scale(run_dir):
    result = bench(run_dir, "--updates", "10", "--rounds", "1", "--variant", "wide", "model.d_model=48")
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])["variants"]["wide"]
    assert row["speed_vs_baseline"] == 1.0 and row["baseline_steps_at_speed"] is None
    assert "no step budget to scale: wide is not" in result.stdout


@pytest.mark.parametrize(("variant", "named"), [
    (["v", "tokenize.vocab_size=800"], "tokenize.vocab_size: only model.* and train.* keys"),
    (["v", "train.max_steps=10"], "train.max_steps is the bench's to set (--updates)"),
    (["v", "model.d_model=-4"], "model.d_model"),
    (["v", "train.nproc=0"], "train.nproc"),
    (["v", "model.dropout"], "expected KEY=VALUE"),
])
def test_a_variant_it_cannot_time_exits_naming_the_key(run_dir, variant, named):
    result = bench(run_dir, "--variant", "config", "--variant", *variant)
    assert result.returncode != 0
    assert named in result.stderr and "--variant v" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_run_without_tokenized_data_exits_naming_the_stage(tmp_path):
    result = bench(tmp_path, "--variant", "config")
    assert result.returncode != 0
    assert "data/tokenized" in result.stderr and "dvc repro tokenize" in result.stderr
