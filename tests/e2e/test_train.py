"""The training stage on real Multi30k pairs: it learns, saves a standard model, resumes exactly, survives and
reports non-finite updates, and trains the same update on 2 processes as on 1 process accumulating 2 batches.
With two directions it validates each direction, decides by their mean, and resumes exactly too."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifacts import Paths
from pipeline.errors import MissingArtifact
from pipeline.params import parse
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.model_languages import ModelLanguages
from stages import tokenize, train
from tests.conftest import write_clean_splits

pytestmark = pytest.mark.e2e

SMALL = {"d_model": 32, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1, "attention_heads": 2}
# One thread: these tiny matrices gain nothing from more, and OpenMP threads sharing cores with other work wait
# on each other.
FAST = {"threads": 1, "valid_bleu_sentences": 16}
# The exactness checks (resume, accumulation against DDP, averaging) compare fp32 arithmetic, on every machine;
# the default `auto` would train in bf16 on one with native bf16 and in fp32 on one without. The bf16 tests ask.
FP32 = {"precision": "fp32"}


TWO = ["en-de", "en-fr"]
# Multi30k named per language (the params need files to name; training reads only data/tokenized).
TWO_DATA = {"source": "files", "directions": TWO,
            "files": {split: {"pattern": f"multi30k/{split}.{{lang}}"} for split in ("train", "valid", "test")}}


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tokenized")
    write_clean_splits(root, {"train": 2000, "valid": 100, "test": 50})
    tokenize.run(parse({"tokenize": {"vocab_size": 500}}), Paths(root))
    return root


@pytest.fixture(scope="module")
def two_directions(tmp_path_factory) -> Path:
    """en-de (1200 train pairs) and en-fr (400) in one corpus, encoded by the tokenize stage (with the target
    tag in front of every source)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("two_directions")
    parts = []
    for direction, sizes in (("en-de", {"train": 1200, "valid": 60, "test": 10}),
                             ("en-fr", {"train": 400, "valid": 40, "test": 10})):
        clean = write_clean_splits(tmp_path_factory.mktemp(direction), sizes, (direction,))
        parts.append({split: pq.read_table(clean / f"{split}.parquet") for split in sizes})
    (root / "data" / "clean").mkdir(parents=True)
    for split in parts[0]:
        pq.write_table(pa.concat_tables([p[split] for p in parts]), root / "data" / "clean" / f"{split}.parquet")
    tokenize.run(parse({"data": TWO_DATA, "tokenize": {"vocab_size": 600}}), Paths(root))
    return root


def run_training(tokenized: Path, tmp_path: Path, on_update=None, **sections) -> tuple[Paths, dict]:
    if not (tmp_path / "data").exists():
        shutil.copytree(tokenized / "data", tmp_path / "data")
    recorded = json.loads((tokenized / "data" / "tokenized" / "hf_tokenizer" / "languages.json").read_text())
    raw = {"model": {"preset": "tiny", **SMALL}, "train": {"max_steps": 20, "valid_every": 10, "log_every": 5,
                                                           "lr": 3e-3, "warmup_steps": 10, "max_tokens": 1024,
                                                           **FAST, **FP32}}
    if recorded["directions"] != ["en-de"]:
        raw["data"] = TWO_DATA
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    paths = Paths(tmp_path)
    return paths, train.run(parse(raw), paths, on_update=on_update)


def crash_before(update: int):
    """An on_update hook that fails the run just before `update` (as a run killed there would stop)."""

    def on_update(rank: int, step: int) -> None:
        if step == update:
            raise RuntimeError(f"rank {rank} failed on purpose before update {step}")

    return on_update


def curve(paths: Paths, name: str) -> dict[int, float]:
    """A DVCLive curve as {step: value}."""
    with open(paths.dvclive / "plots" / "metrics" / f"{name}.tsv", encoding="utf-8") as f:
        return {int(row["step"]): float(row[name.split("/")[-1]]) for row in csv.DictReader(f, delimiter="\t")}


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_an_update_takes_the_same_batches_however_processes_and_accumulation_split_it():
    import numpy as np

    from stages.train.batching import epoch_batches, update_target_tokens

    batches = [np.array([i]) for i in range(23)]
    tokens = np.arange(100, 123)

    def updates(world, update_freq):
        per_rank = [epoch_batches(batches, 2, 7, r, world, update_freq) for r in range(world)]
        n = len(per_rank[0]) // update_freq
        return [sorted(int(b[0]) for rank in per_rank for b in rank[u * update_freq : (u + 1) * update_freq])
                for u in range(n)]

    assert updates(2, 1) == updates(1, 2) and len(updates(1, 2)) == 11  # 23 batches: 11 updates of 2
    assert updates(4, 1) == updates(2, 2) == updates(1, 4)
    assert len(updates(4, 1)) == 5 and all(len(u) == 4 for u in updates(4, 1))
    # The loss normaliser every rank computes for itself: the update's target tokens over all its batches.
    assert update_target_tokens(tokens, 2, 7, 2).tolist() == [sum(tokens[i] for i in u) for u in updates(1, 2)]


def test_the_training_loop_imports_only_what_a_bare_gpu_machine_has():
    code = ("import sys, stages.train.loop\n"
            "print(','.join(m for m in ('pydantic', 'pyarrow', 'pandas', 'great_expectations', 'dvc', 'prefect', "
            "'datasets', 'sacrebleu') if m in sys.modules))")
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_training_lowers_the_validation_loss_and_saves_a_standard_model(tokenized, tmp_path):
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    paths, metrics = run_training(tokenized, tmp_path, train={"max_steps": 80, "valid_every": 40, "save_every": 20,
                                                              "average_last": 3})
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
                 "valid/loss.tsv", "valid/bleu.tsv", "system/cpu_percent.tsv", "system/rss_gb.tsv"):
        assert (curves / name).stat().st_size > 0, name
    assert sorted(curve(paths, "valid/bleu")) == [40, 80]
    assert not (curves / "valid" / "en-de").exists() and "directions" not in metrics  # one direction: the means

    # models/final is the mean of the last 3 checkpoints (updates 40, 60, 80), not the last or best weights.
    ckpt = paths.checkpoints
    assert {p.name for p in ckpt.iterdir()} >= {"last.pt", "best.pt", "average"}
    snapshots = [torch.load(ckpt / "average" / f"step-{s:09d}.pt") for s in (40, 60, 80)]
    assert sorted(p.name for p in (ckpt / "average").iterdir()) == [f"step-{s:09d}.pt" for s in (40, 60, 80)]
    assert metrics["final_model"] == "average of the checkpoints at updates 40, 60, 80"
    final = weights(paths.final_model)
    for name, tensor in final.items():
        key = name if name in snapshots[0] else "model.shared.weight"  # tied embeddings are saved once
        expected = sum(s[key].double() for s in snapshots) / 3
        assert torch.allclose(tensor.double(), expected, atol=1e-6), name
    assert not torch.equal(final["model.shared.weight"], snapshots[-1]["model.shared.weight"])
    last = torch.load(ckpt / "last.pt", weights_only=False)
    assert set(last) >= {"model", "optimizer", "schedule", "scaler", "rng", "progress", "fingerprint"}
    assert last["progress"]["step"] == 80 and set(last["rng"][0]) == {"python", "numpy", "torch"}


def test_the_same_seed_gives_the_same_weights(tokenized, tmp_path):
    import torch

    first, _ = run_training(tokenized, tmp_path / "a")
    second, metrics = run_training(tokenized, tmp_path / "b")
    a, b = (weights(p.final_model) for p in (first, second))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # average_last 1: models/final holds the weights with the best valid loss
    assert metrics["final_model"] == f"best valid loss, update {metrics['best_step']}"


@pytest.mark.parametrize(("data", "word_dropout"), [("tokenized", 0.0), ("two_directions", 0.0), ("tokenized", 0.2)])
def test_a_crashed_run_resumes_into_the_same_updates_as_an_uninterrupted_one(data, word_dropout, tmp_path, request):
    import torch

    tokenized = request.getfixturevalue(data)
    settings = {"max_steps": 30, "save_every": 10, "valid_every": 15, "log_every": 5, "word_dropout": word_dropout}
    if data == "two_directions":  # each epoch's pairs are sampled: 16 updates an epoch, so it resumes in epoch 2
        settings["max_tokens"] = 4096
    whole, whole_metrics = run_training(tokenized, tmp_path / "whole", train=settings)

    with pytest.raises(RuntimeError, match="on purpose"):  # crash before update 24: last.pt holds update 20
        run_training(tokenized, tmp_path / "split", on_update=crash_before(24), train=settings)
    split, split_metrics = run_training(tokenized, tmp_path / "split", train=settings)

    assert split_metrics["resumed_from_step"] == 20 and whole_metrics["resumed_from_step"] is None
    assert split_metrics["steps"] == whole_metrics["steps"] == 30
    assert split_metrics["epochs"] == whole_metrics["epochs"] == (1 if data == "tokenized" else 2)
    # Same updates: dropout masks (RNG states), batches (data position), Adam moments and schedule all resumed.
    assert curve(split, "train/loss") == curve(whole, "train/loss")
    assert curve(split, "valid/loss") == curve(whole, "valid/loss")
    a = torch.load(whole.checkpoints / "last.pt", weights_only=False)["model"]
    b = torch.load(split.checkpoints / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)

    # Raising max_steps continues the finished run; a change that alters the updates starts from scratch.
    _, more = run_training(tokenized, tmp_path / "split", train={**settings, "max_steps": 35})
    assert more["resumed_from_step"] == 30 and more["steps"] == 35


def test_a_checkpoint_of_another_configuration_is_not_resumed(tokenized, tmp_path, caplog):
    run_training(tokenized, tmp_path, train={"max_steps": 10, "save_every": 5})
    with caplog.at_level(logging.INFO, logger="mtpipe.train"):
        _, metrics = run_training(tokenized, tmp_path, train={"max_steps": 10, "save_every": 5, "lr": 1e-3})
    assert metrics["resumed_from_step"] is None and metrics["steps"] == 10
    assert "different configuration (train.lr 0.003 -> 0.001): starting fresh" in caplog.text


def poison(monkeypatch, bad_calls):
    """Make the training loss NaN on the given training forward passes (counted from 1)."""
    from stages.train import loop

    real, calls = loop.seq2seq_loss, {"n": 0}

    def patched(model, inputs, label_smoothing, *scale):
        loss = real(model, inputs, label_smoothing, *scale)
        if model.training:
            calls["n"] += 1
            if bad_calls(calls["n"]):
                return loss * float("nan")
        return loss

    monkeypatch.setattr(loop, "seq2seq_loss", patched)


def test_word_dropout_drops_training_words_to_unk_and_never_tags_or_validation_words(two_directions, tmp_path,
                                                                                       monkeypatch):
    from stages.train import loop

    real, seen = loop.seq2seq_loss, {True: [], False: []}

    def recording(model, inputs, label_smoothing, *scale):
        seen[model.training].append({name: inputs[name].clone() for name in ("input_ids", "decoder_input_ids")})
        return real(model, inputs, label_smoothing, *scale)

    monkeypatch.setattr(loop, "seq2seq_loss", recording)
    paths, _ = run_training(two_directions, tmp_path, train={"max_steps": 10, "word_dropout": 0.3})
    meta = json.loads((paths.tokenized / "meta.json").read_text())
    tags = ModelLanguages.read(paths.tokenized / "hf_tokenizer").special_ids
    for training, batches in seen.items():
        source = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
        words = ~np.isin(source, [meta["pad_id"], meta["eos_id"], *tags])
        unk_share = float((source[words] == meta["unk_id"]).mean())
        assert (0.25 < unk_share < 0.35) if training else unk_share == 0.0
        assert np.isin(list(tags), source).all()  # each direction's tag is still in front of its sources
        target = np.concatenate([b["decoder_input_ids"].numpy().ravel() for b in batches])
        assert ((target == meta["unk_id"]).mean() > 0.15) == training


def test_non_finite_updates_are_skipped_counted_and_logged(tokenized, tmp_path, monkeypatch, caplog):
    poison(monkeypatch, lambda n: n in (3, 4, 9))
    with caplog.at_level(logging.WARNING, logger="mtpipe.train"):
        paths, metrics = run_training(tokenized, tmp_path, train={"max_steps": 10})
    assert metrics["steps"] == 10 and metrics["skipped_updates"] == 3  # 13 batches for 10 updates
    assert "non-finite loss or gradient after update 2: update skipped (2 in a row, 2 in all)" in caplog.text
    assert all(math.isfinite(v) for v in curve(paths, "train/loss").values())
    assert curve(paths, "train/skipped_updates")[10] == 3


def test_too_many_non_finite_updates_in_a_row_stop_the_stage_with_a_clear_error(tokenized, tmp_path, monkeypatch,
                                                                                   caplog):
    poison(monkeypatch, lambda n: n > 4)
    shutil.copytree(tokenized / "data", tmp_path / "data")
    (tmp_path / "params.yaml").write_text(json.dumps({
        "model": {"preset": "tiny", **SMALL}, "train": {"max_steps": 20, "max_bad_steps": 3, **FAST}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["stages.train", "params.yaml"])
    with pytest.raises(SystemExit) as exit_info, caplog.at_level(logging.ERROR):
        train._main()
    assert exit_info.value.code == 1
    assert "training diverged: 3 updates in a row after update 4 had a non-finite loss or gradient" in caplog.text


def test_early_stopping_after_patience_validations_without_improvement(tokenized, tmp_path, monkeypatch):
    from stages.train import loop

    real = loop.seq2seq_loss
    # A valid loss that never improves after the first validation.
    monkeypatch.setattr(loop, "seq2seq_loss", lambda m, i, ls, *scale: real(m, i, ls, *scale) if m.training else
                        (i["labels"] != -100).sum().double() * 5)
    _, metrics = run_training(tokenized, tmp_path, train={"max_steps": 100, "valid_every": 4, "patience": 2})
    assert metrics["stop_reason"] == "early_stopping" and metrics["steps"] == 12 and metrics["best_step"] == 4


def test_bf16_autocast_trains_with_a_finite_loss(tokenized, tmp_path):
    _, metrics = run_training(tokenized, tmp_path, train={"precision": "bf16"})
    assert metrics["precision"] == "bf16" and math.isfinite(metrics["best_valid_loss"])


def test_auto_precision_is_what_this_machine_computes_natively_and_is_recorded_with_why(tokenized, tmp_path):
    import torch

    from stages.train.precision import resolve_precision

    _, metrics = run_training(tokenized, tmp_path, train={"precision": "auto", "max_steps": 10})
    expected, reason = resolve_precision("auto", torch.device("cpu"))
    assert (metrics["precision"], metrics["precision_reason"]) == (expected, reason)
    assert reason.startswith("train.precision auto: ")


def test_a_crashed_bf16_run_resumes_into_the_same_updates_as_an_uninterrupted_one(tokenized, tmp_path):
    import torch

    settings = {"precision": "bf16", "max_steps": 20, "save_every": 10, "valid_every": 10, "log_every": 5}
    whole, _ = run_training(tokenized, tmp_path / "whole", train=settings)
    with pytest.raises(RuntimeError, match="on purpose"):
        run_training(tokenized, tmp_path / "split", on_update=crash_before(14), train=settings)
    split, metrics = run_training(tokenized, tmp_path / "split", train=settings)
    assert metrics["resumed_from_step"] == 10 and metrics["precision"] == "bf16"
    assert curve(split, "train/loss") == curve(whole, "train/loss")
    a = torch.load(whole.checkpoints / "last.pt", weights_only=False)["model"]
    b = torch.load(split.checkpoints / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_with_gradient_checkpointing_trains_exactly_as_without_it(tokenized, tmp_path):
    runs = {on: run_training(tokenized, tmp_path / str(on), train={"precision": "bf16", "max_steps": 10,
                                                                   "gradient_checkpointing": on})[0]
            for on in (False, True)}
    assert curve(runs[True], "train/loss") == curve(runs[False], "train/loss")
    a, b = weights(runs[True].final_model), weights(runs[False].final_model)
    assert all(a[k].equal(b[k]) for k in a)


def test_two_bf16_processes_through_torchrun_with_gloo_end_with_identical_replicas(tokenized, tmp_path):
    params_file = write_params(tmp_path, tokenized, {"nproc": 2, "precision": "bf16"})
    metrics = train.run(parse(json.loads(params_file.read_text())), Paths(tmp_path), params_file=str(params_file))
    assert metrics["processes"] == 2 and metrics["precision"] == "bf16" and metrics["steps"] == 6
    assert len(metrics["replica_digests"]) == 1 and math.isfinite(metrics["final_valid_loss"])


def test_a_bf16_trained_model_exports_through_the_parity_gate(tokenized, tmp_path):
    from stages import export

    paths, _ = run_training(tokenized, tmp_path, train={"precision": "bf16"})
    metrics = export.run(parse({"model": {"preset": "tiny", **SMALL},
                                "export": {"parity_sentences": 8, "int8": False, "torchscript": False}}), paths)
    report = json.loads(paths.metrics("export").read_text())
    assert (paths.export / "encoder.onnx").is_file() and report["identical_share"] == 1.0, metrics


def test_time_limit_stops_training(tokenized, tmp_path):
    _, metrics = run_training(tokenized, tmp_path, train={"max_steps": 100000, "max_minutes": 0.02})
    assert metrics["stop_reason"] == "max_minutes" and metrics["steps"] < 100000


def test_pretrained_init_fine_tunes_the_checkpoint(tmp_path, tiny_model_dir):
    write_clean_splits(tmp_path, {"train": 500, "valid": 50, "test": 20})
    params = parse({"model": {"init": "pretrained", "name_or_path": str(tiny_model_dir)},
                    "train": {"max_steps": 5, "valid_every": 5, **FAST}})
    tokenize.run(params, Paths(tmp_path))
    metrics = train.run(params, Paths(tmp_path))
    from transformers import AutoConfig

    assert metrics["steps"] == 5
    assert AutoConfig.from_pretrained(tmp_path / "models/final").d_model == AutoConfig.from_pretrained(
        tiny_model_dir).d_model


def write_params(root: Path, tokenized: Path, train_settings: dict) -> Path:
    shutil.copytree(tokenized / "data", root / "data")
    params_file = root / "params.yaml"
    params_file.write_text(json.dumps({
        # dropout 0: the two layouts below draw different dropout masks, everything else is the same arithmetic
        "model": {"preset": "tiny", **SMALL, "dropout": 0.0},
        "train": {"max_steps": 6, "valid_every": 3, "log_every": 1, "max_tokens": 1024, "threads": 1,
                  "valid_bleu_sentences": 0, **FP32, **train_settings},
    }))
    return params_file


def test_two_processes_train_through_torchrun_with_gloo(tokenized, tmp_path):
    """2 ranks x 1 batch per update == 1 process x 2 accumulated batches: the same batches make each update."""
    import torch

    params_file = write_params(tmp_path / "ddp", tokenized, {"nproc": 2})
    paths = Paths(tmp_path / "ddp")
    metrics = train.run(parse(json.loads(params_file.read_text())), paths, params_file=str(params_file))
    assert metrics["processes"] == 2 and metrics["steps"] == 6
    assert (paths.final_model / "model.safetensors").exists()
    assert len(metrics["replica_digests"]) == 1  # both ranks ended with bit-identical parameters

    single_file = write_params(tmp_path / "single", tokenized, {"nproc": 1, "update_freq": 2})
    single = Paths(tmp_path / "single")
    single_metrics = train.run(parse(json.loads(single_file.read_text())), single)
    assert single_metrics["processes"] == 1 and single_metrics["update_freq"] == 2
    ddp_loss, single_loss = curve(paths, "train/loss"), curve(single, "train/loss")
    assert sorted(ddp_loss) == sorted(single_loss) == [1, 2, 3, 4, 5, 6]
    for step in ddp_loss:
        assert ddp_loss[step] == pytest.approx(single_loss[step], rel=1e-5), step
    # The gradient itself (Adam would hide a gradient off by a constant factor from the loss curve).
    ddp_norm, single_norm = curve(paths, "train/grad_norm"), curve(single, "train/grad_norm")
    assert all(ddp_norm[s] == pytest.approx(single_norm[s], rel=1e-4) for s in ddp_norm)
    assert curve(paths, "valid/loss")[6] == pytest.approx(curve(single, "valid/loss")[6], rel=1e-5)
    a, b = weights(paths.final_model), weights(single.final_model)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def kill_with_children(process: subprocess.Popen) -> None:
    """SIGKILL a process that is still running and every process under it (torchrun starts each worker in a
    session of its own, so killing the stage alone would leave them running)."""
    import psutil

    if process.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(process.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        process.kill()
    process.wait()


def test_a_rank_that_dies_ends_the_job_non_zero_without_hanging(tokenized, tmp_path):
    """Rank 1's process is SIGKILLed (as the OOM killer ends one) once rank 0 has logged update 2: torchrun stops
    the other rank and names the killed one, and the stage fails with torchrun's exit code, writing no model."""
    import psutil

    params_file = write_params(tmp_path, tokenized, {"nproc": 2, "max_steps": 100_000})  # only the kill ends it
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    output = tmp_path / "stage.log"
    with open(output, "w", encoding="utf-8") as out:
        stage = subprocess.Popen([sys.executable, "-m", "stages.train", str(params_file)], cwd=tmp_path, env=env,
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while " INFO step 2 epoch " not in output.read_text(encoding="utf-8"):
            assert stage.poll() is None and time.monotonic() < deadline, output.read_text(encoding="utf-8")
            time.sleep(0.05)
        rank_1 = next(p for p in psutil.Process(stage.pid).children(recursive=True) if p.environ().get("RANK") == "1")
        rank_1.kill()
        returncode = stage.wait(timeout=240)
    finally:
        kill_with_children(stage)
    log = output.read_text(encoding="utf-8")
    assert returncode == 1, log
    assert f"Signal 9 (SIGKILL) received by PID {rank_1.pid}" in log
    assert "distributed training failed (torchrun exit code 1" in log
    assert not (tmp_path / "models" / "final").exists()


def test_cpu_dropout_keeps_1_minus_p_of_the_values_scaled_and_is_swapped_in_only_on_cpus():
    import threading

    import torch
    import torch.nn.functional as F

    from stages.train.dropout import MASK_LEVELS, cpu_dropout, training_dropout

    x = torch.ones(1000, 1000, requires_grad=True)
    torch.manual_seed(0)
    y = cpu_dropout(x, p=0.2)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.8) < 0.003  # 1M draws: the standard error is 0.0004
    # Each 64-bit draw makes four masks: each of the four keeps its share (no bits lost to a sign or a range).
    for quarter in range(4):
        assert abs(kept.view(-1)[quarter::4].float().mean().item() - 0.8) < 0.005
    dropped = round(0.2 * MASK_LEVELS)  # p rounded to 1/65536; the scale is the rounded p's, 1.2500095
    assert torch.all(y[kept] == MASK_LEVELS / (MASK_LEVELS - dropped)) and abs(y.mean().item() - 1.0) < 0.005
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # the gradient goes through the same mask and scale
    assert cpu_dropout(x, p=0.2, training=False) is x and cpu_dropout(x, p=0.0) is x
    assert torch.count_nonzero(cpu_dropout(x, p=1.0)) == 0
    odd = cpu_dropout(torch.ones(7, 3, 5), p=0.5)  # 105 values: not a whole number of draws
    assert odd.shape == (7, 3, 5) and set(odd.unique().tolist()) <= {0.0, 2.0}

    # Inside the block, F.dropout calls draw the CPU masks; the function itself is never rebound.
    original = F.dropout
    ones = torch.ones(200, 200)
    torch.manual_seed(1)
    expected = cpu_dropout(ones, p=0.3)
    torch.manual_seed(1)
    with training_dropout(torch.device("cpu")):
        assert F.dropout is original
        assert torch.equal(F.dropout(ones, p=0.3, training=True), expected)
        # Another thread calling dropout meanwhile gets PyTorch's own (a different mask from the same seed).
        seen = {}

        def other_thread():
            torch.manual_seed(1)
            seen["mask"] = F.dropout(ones, p=0.3, training=True)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert not torch.equal(seen["mask"], expected)
    torch.manual_seed(1)
    assert torch.equal(seen["mask"], F.dropout(ones, p=0.3, training=True))  # outside the block: PyTorch's
    torch.manual_seed(1)
    with training_dropout(torch.device("meta")):  # any other device keeps PyTorch's own
        assert torch.equal(F.dropout(ones, p=0.3, training=True), seen["mask"])


# ---- several directions ----


def test_two_directions_mix_in_training_batches_and_are_validated_apart_and_decided_by_their_mean(
        two_directions, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from stages.train import loop

    tags = AutoTokenizer.from_pretrained(two_directions / "data/tokenized/hf_tokenizer").convert_tokens_to_ids(
        [">>de<<", ">>fr<<"])
    real, first_tokens = loop.seq2seq_loss, {True: [], False: []}

    def recording(model, inputs, label_smoothing, *scale):  # which target tags start the batch's sources
        first_tokens[model.training].append(set(inputs["input_ids"][:, 0].tolist()))
        return real(model, inputs, label_smoothing, *scale)

    monkeypatch.setattr(loop, "seq2seq_loss", recording)
    paths, metrics = run_training(two_directions, tmp_path, train={"valid_bleu_sentences": 8})

    assert any(seen == set(tags) for seen in first_tokens[True])  # training batches mix the directions
    assert all(seen in ({tags[0]}, {tags[1]}) for seen in first_tokens[False])  # each valid batch is one direction
    loss, bleu = curve(paths, "valid/loss"), curve(paths, "valid/bleu")
    own = {(d, figure): curve(paths, f"valid/{d}/{figure}") for d in TWO for figure in ("loss", "bleu")}
    assert sorted(loss) == sorted(bleu) == [10, 20] and all(sorted(c) == [10, 20] for c in own.values())
    for step in (10, 20):
        assert loss[step] == pytest.approx((own["en-de", "loss"][step] + own["en-fr", "loss"][step]) / 2, rel=1e-9)
        assert bleu[step] == pytest.approx((own["en-de", "bleu"][step] + own["en-fr", "bleu"][step]) / 2, rel=1e-9)
    assert own["en-de", "loss"] != own["en-fr", "loss"]

    # best.pt, early stopping and metrics/train.json go by the mean; the directions' own figures sit beside it.
    best = metrics["best_step"]
    assert best == min(loss, key=loss.get) and metrics["best_valid_loss"] == pytest.approx(loss[best], abs=1e-4)
    figures = metrics["directions"]
    assert list(figures) == TWO
    for d in TWO:
        assert figures[d]["best_valid_loss"] == pytest.approx(own[d, "loss"][best], abs=1e-4)
        assert figures[d]["best_valid_bleu"] == pytest.approx(own[d, "bleu"][best], abs=1e-2)
    rows = np.bincount(np.load(paths.tokenized / "train.dir.npy"), minlength=2)
    assert [figures[d]["train_pairs"] for d in TWO] == rows.tolist()
    # train.temperature 1.5: the smaller direction gets more than its share of an epoch, the larger less.
    assert figures["en-fr"]["epoch_pairs"] > rows[1] and figures["en-de"]["epoch_pairs"] < rows[0]
    assert json.loads(paths.metrics("train").read_text()) == metrics
    # languages.json travels with the tokenizer
    assert ModelLanguages.read(paths.final_model).directions.names == TWO


def test_a_missing_or_inconsistent_direction_file_stops_training_naming_it(tmp_path):
    from stages.train.directions import row_directions, rows_by_direction

    with pytest.raises(MissingArtifact, match=r"train\.dir\.npy not found: it is produced by the 'tokenize' stage"):
        row_directions(tmp_path, "train", 3, TWO)
    np.save(tmp_path / "train.dir.npy", np.array([0, 1], dtype=np.uint8))
    with pytest.raises(PipelineError, match=r"train\.dir\.npy holds 2 directions for the 3 pairs of train\.src"):
        row_directions(tmp_path, "train", 3, TWO)
    np.save(tmp_path / "train.dir.npy", np.array([0, 2, 1], dtype=np.uint8))
    with pytest.raises(PipelineError, match=r"train\.dir\.npy, row 1: direction index 2, but languages\.json lists 2 "):
        row_directions(tmp_path, "train", 3, TWO)
    with pytest.raises(PipelineError, match=r"data/tokenized/valid has no pairs of direction\(s\) en-fr"):
        rows_by_direction(np.zeros(4, dtype=np.uint8), TWO, "valid")
    assert [r.tolist() for r in rows_by_direction(np.array([1, 0, 1], dtype=np.uint8), TWO, "valid")] == [[1], [0, 2]]


def test_the_logged_valid_figures_are_the_means_over_directions_beside_each_directions_own():
    from stages.train.directions import validation_row

    assert validation_row(["en-de"], [2.5], [30.0]) == {"valid/loss": 2.5, "valid/bleu": 30.0}
    assert validation_row(TWO, [2.0, 3.0], [30.0, 20.0]) == {
        "valid/loss": 2.5, "valid/bleu": 25.0, "valid/en-de/loss": 2.0, "valid/en-de/bleu": 30.0,
        "valid/en-fr/loss": 3.0, "valid/en-fr/bleu": 20.0}
    assert validation_row(TWO, [2.0, 3.0], None) == {"valid/loss": 2.5, "valid/en-de/loss": 2.0,
                                                     "valid/en-fr/loss": 3.0}


def test_the_temperature_is_part_of_the_resume_fingerprint_only_with_several_directions(tmp_path):
    from stages.train import checkpoint

    def digest(temperature, directions):
        spec = train.train_spec(parse({"train": {"temperature": temperature}}), Paths(tmp_path))
        return checkpoint.fingerprint(spec, 1, tmp_path, directions)["digest"]

    assert digest(1.5, 1) == digest(3.0, 1)  # one direction is never sampled
    assert digest(1.5, 2) != digest(3.0, 2)


def test_direction_weights_join_the_resume_fingerprint_only_when_set_and_with_several_directions(tmp_path):
    from stages.train import checkpoint

    several = {"source": "files", "directions": ["en-de", "en-fr"],
               "files": {split: {"pattern": f"{split}.{{lang}}.gz"} for split in ("train", "valid", "test")}}

    def digest(weights, directions):
        spec = train.train_spec(parse({"data": several, "train": {"direction_weights": weights}}), Paths(tmp_path))
        return checkpoint.fingerprint(spec, 1, tmp_path, directions)["digest"]

    unweighted = train.train_spec(parse({"data": several}), Paths(tmp_path))
    assert digest({}, 2) == checkpoint.fingerprint(unweighted, 1, tmp_path, 2)["digest"]  # earlier checkpoints resume
    assert digest({"en-de": 2.0}, 2) != digest({}, 2)
    assert digest({"en-de": 2.0}, 1) == digest({}, 1)


def test_word_dropout_joins_the_resume_fingerprint_only_when_set(tmp_path):
    from stages.train import checkpoint

    def fields(word_dropout):
        spec = train.train_spec(parse({"train": {"word_dropout": word_dropout}}), Paths(tmp_path))
        return checkpoint.fingerprint(spec, 1, tmp_path)["fields"]["train"]

    assert "word_dropout" not in fields(0.0)  # a checkpoint saved before the parameter existed still resumes
    assert fields(0.1)["word_dropout"] == 0.1 and fields(0.1) != fields(0.2)
