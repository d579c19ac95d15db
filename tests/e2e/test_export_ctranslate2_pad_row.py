"""A Marian model's <pad> row and the CTranslate2 gate, through the stages: CTranslate2's converter drops that row
and starts the decoder from a zero vector, so the export stage fails a model whose row is not zero (in float32
and in int8), naming the parameter, the figures and the row, and publishes nothing; the same model with the row at
zero passes and reports its thresholds; and the train stage zeroes the row of a pretrained Marian checkpoint
before its first update, saying so. The gate's rule and the rows it concerns are
tests/unit/test_export_ctranslate2_gate.py's.

The export runs convert to CTranslate2 alone (`onnx: false`): the ONNX gate is test_export.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.artifacts import Paths, read_json
from pipeline.errors import ParityFailed
from pipeline.params import parse
from pipeline.runtime.languages import Directions
from tests.conftest import write_clean_splits
from tests.support.export_helpers import CTRANSLATE2_INSTALLED, one_torch_thread
from tests.support.fine_tuned import redrawn, write_languages
from tests.support.tiny_checkpoints import build_tiny

pytestmark = pytest.mark.e2e

needs_ctranslate2 = pytest.mark.skipif(not CTRANSLATE2_INSTALLED,
                                       reason="ctranslate2 is not installed (the `ct2` extra)")
PARITY_SENTENCES = 8
CTRANSLATE2_ONLY = {"onnx": False, "int8": False, "torchscript": False, "ctranslate2": True,
                    "parity_sentences": PARITY_SENTENCES}


def opus_mt_root(root: Path, pad_row_std: float) -> Paths:
    """`root` as a project after fine-tuning the hub-shaped OPUS-MT en-de checkpoint: data/clean, and models/final
    with redrawn (decisive) weights whose <pad> row is drawn with `pad_row_std` (0: zero, as training keeps it)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    paths = Paths(root)
    write_clean_splits(root, {"valid": PARITY_SENTENCES, "test": PARITY_SENTENCES})
    build_tiny("opus-mt", paths.final_model)
    model = AutoModelForSeq2SeqLM.from_pretrained(paths.final_model)
    redrawn(model)
    if pad_row_std:  # redrawn keeps it at zero
        with torch.no_grad():
            pad_row = model.get_input_embeddings().weight[model.config.pad_token_id]
            pad_row.normal_(0, pad_row_std, generator=torch.Generator().manual_seed(3))
    model.save_pretrained(paths.final_model)
    write_languages(paths.final_model, Directions.of(["en-de"]))
    return paths


@needs_ctranslate2
@pytest.mark.parametrize("quantization", ["float32", "int8"])
def test_a_marian_model_whose_pad_row_is_not_zero_fails_the_ctranslate2_gate_and_publishes_nothing(
        quantization, tmp_path):
    from stages import export

    paths = opus_mt_root(tmp_path, pad_row_std=0.3)
    params = parse({"export": {**CTRANSLATE2_ONLY, "ctranslate2_quantization": quantization}})
    with one_torch_thread(), pytest.raises(ParityFailed) as failed:
        export.run(params, paths)
    message = str(failed.value)
    assert "en-de: ctranslate2 greedy outputs identical to PyTorch for " in message
    assert f"of {PARITY_SENTENCES} sentences < export.ctranslate2_min_identical 80.00%" in message
    assert "<pad> embedding row" in message and "dvc repro train" in message
    assert not paths.export.exists() and not paths.metrics("export").exists()


@needs_ctranslate2
def test_the_same_model_with_its_pad_row_at_zero_passes_and_reports_the_thresholds(tmp_path):
    from stages import export

    paths = opus_mt_root(tmp_path, pad_row_std=0.0)
    with one_torch_thread():
        export.run(parse({"export": {**CTRANSLATE2_ONLY, "ctranslate2_quantization": "float32"}}), paths)
    report = read_json(paths.metrics("export"))
    assert report["directions"]["en-de"]["ctranslate2"]["identical_share"] == 1.0
    assert report["ctranslate2"]["thresholds"] == {"min_identical": 0.8, "max_bleu_delta": 1.0}
    assert (paths.export / "ctranslate2" / "model.bin").is_file()


def test_a_pretrained_marian_whose_pad_row_is_not_zero_is_zeroed_before_training_with_a_warning(
        tmp_path, caplog):
    """An OPUS-MT checkpoint fine-tuned elsewhere with its <pad> row trained: train zeroes the row before the first
    update (saying so, with its norm) and keeps it at zero, so models/final is one CTranslate2 can run."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from stages import tokenize, train

    checkpoint = build_tiny("opus-mt", tmp_path / "checkpoint")
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    pad = model.config.pad_token_id
    with torch.no_grad():
        model.get_input_embeddings().weight[pad].fill_(0.1)
    model.save_pretrained(checkpoint)
    write_clean_splits(tmp_path, {"train": 64, "valid": 8, "test": 8})
    files = {split: {"pattern": f"corpus/{split}.{{lang}}"} for split in ("train", "valid", "test")}
    params = parse({"data": {"source": "files", "directions": ["en-de"], "files": files},
                    "model": {"init": "pretrained", "name_or_path": str(checkpoint)},
                    "train": {"max_steps": 4, "threads": 1, "valid_bleu_sentences": 0, "max_tokens": 600,
                              "log_every": 2, "valid_every": 4, "save_every": 4, "warmup_steps": 2, "lr": 3e-3}})
    paths = Paths(tmp_path)
    tokenize.run(params, paths)
    with caplog.at_level("WARNING", logger="mtpipe.train"):
        train.run(params, paths)
    warnings = [r.getMessage() for r in caplog.records if "<pad> embedding row" in r.getMessage()]
    assert len(warnings) == 1 and f"norm {0.1 * 32 ** 0.5:.3g}" in warnings[0], warnings
    trained = AutoModelForSeq2SeqLM.from_pretrained(paths.final_model)
    assert trained.get_input_embeddings().weight[pad].abs().max().item() == 0.0
    # It trained: the other rows moved.
    assert not torch.equal(trained.get_input_embeddings().weight[:pad], model.get_input_embeddings().weight[:pad])
