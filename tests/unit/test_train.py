"""The training stage on real Multi30k pairs: it learns, saves a standard model, and every mode runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from stages import tokenize, train
from tests.conftest import write_clean_splits

SMALL = {"d_model": 32, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1, "attention_heads": 2}


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tokenized")
    write_clean_splits(root, {"train": 2000, "valid": 100, "test": 50})
    tokenize.run(parse({"tokenize": {"vocab_size": 500}}), Paths(root))
    return root


def run_training(tokenized: Path, tmp_path: Path, **sections) -> tuple[Paths, dict]:
    shutil.copytree(tokenized / "data", tmp_path / "data")
    raw = {"model": {"preset": "tiny", **SMALL}, "train": {"max_steps": 20, "valid_every": 10, "log_every": 5,
                                                           "lr": 3e-3, "warmup_steps": 10, "max_tokens": 1024}}
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    paths = Paths(tmp_path)
    return paths, train.run(parse(raw), paths)


def test_training_lowers_the_validation_loss_and_saves_a_standard_model(tokenized, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    paths, metrics = run_training(tokenized, tmp_path, train={"max_steps": 80, "valid_every": 40})
    vocab = json.loads((tokenized / "data/tokenized/meta.json").read_text())["vocab_size"]
    assert metrics["steps"] == 80 and metrics["stop_reason"] == "max_steps"
    assert metrics["best_valid_loss"] < 0.8 * math.log2(vocab)  # an untrained model scores about log2(vocab)
    assert json.loads(paths.metrics("train").read_text()) == metrics
    model = AutoModelForSeq2SeqLM.from_pretrained(paths.final_model)
    tok = AutoTokenizer.from_pretrained(paths.final_model)
    assert model.config.d_model == 32 and tok.pad_token_id == vocab - 1
    assert model.get_input_embeddings().weight[tok.pad_token_id].abs().max().item() == 0.0  # <pad> row kept at zero
    curves = paths.dvclive / "plots" / "metrics"
    for name in ("train/loss.tsv", "train/lr.tsv", "train/tgt_tokens_per_s.tsv", "train/padding_efficiency.tsv",
                 "valid/loss.tsv"):
        assert (curves / name).stat().st_size > 0, name


def test_the_same_seed_gives_the_same_weights(tokenized, tmp_path):
    import torch
    from safetensors.torch import load_file

    first, _ = run_training(tokenized, tmp_path / "a")
    second, _ = run_training(tokenized, tmp_path / "b")
    a, b = (load_file(p.final_model / "model.safetensors") for p in (first, second))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_autocast_trains_with_a_finite_loss(tokenized, tmp_path):
    _, metrics = run_training(tokenized, tmp_path, train={"precision": "bf16"})
    assert metrics["precision"] == "bf16" and math.isfinite(metrics["best_valid_loss"])


def test_time_limit_stops_training(tokenized, tmp_path):
    _, metrics = run_training(tokenized, tmp_path, train={"max_steps": 100000, "max_minutes": 0.05})
    assert metrics["stop_reason"] == "max_minutes" and metrics["steps"] < 100000


def test_pretrained_init_fine_tunes_the_checkpoint(tmp_path, tiny_model_dir):
    write_clean_splits(tmp_path, {"train": 500, "valid": 50, "test": 20})
    params = parse({"model": {"init": "pretrained", "name_or_path": str(tiny_model_dir)},
                    "train": {"max_steps": 5, "valid_every": 5}})
    tokenize.run(params, Paths(tmp_path))
    metrics = train.run(params, Paths(tmp_path))
    from transformers import AutoConfig

    assert metrics["steps"] == 5
    assert AutoConfig.from_pretrained(tmp_path / "models/final").d_model == AutoConfig.from_pretrained(
        tiny_model_dir).d_model


def test_two_processes_train_through_torchrun_with_gloo(tokenized, tmp_path):
    shutil.copytree(tokenized / "data", tmp_path / "data")
    params_file = tmp_path / "params.yaml"
    params_file.write_text(json.dumps({
        "model": {"preset": "tiny", **SMALL},
        "train": {"max_steps": 6, "valid_every": 3, "log_every": 3, "max_tokens": 1024, "nproc": 2, "threads": 1},
    }))
    paths = Paths(tmp_path)
    metrics = train.run(parse(json.loads(params_file.read_text())), paths, params_file=str(params_file))
    assert metrics["processes"] == 2 and metrics["steps"] == 6
    assert (paths.final_model / "model.safetensors").exists()
