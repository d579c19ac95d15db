"""The CTranslate2 model is gated as the ONNX graphs are: its greedy outputs against PyTorch's, per direction, with
thresholds of its own (`export.ctranslate2_min_identical`, `export.ctranslate2_max_bleu_delta`); a failure names
the parameter, the figures and what to do, and publishes nothing. What CTranslate2 changes is a Marian model's
<pad> row (its converter drops it and starts the decoder from a zero vector), so that row is what training keeps
at zero, for a Marian model only, and a model whose row is not zero fails the gate saying so.

Here the gate's rule on parity reports, and the rows the converter replaces; the stages' runs on a model whose row
is or is not zero are tests/e2e/test_export_ctranslate2_pad_row.py's, the ONNX gate tests/e2e/test_export.py's.
"""

from __future__ import annotations

import pytest

from pipeline.params import parse
from stages.export.gate import ctranslate2_failures, ctranslate2_fix, gate_message, parity_failures
from tests.support.export_helpers import CTRANSLATE2_INSTALLED

needs_ctranslate2 = pytest.mark.skipif(not CTRANSLATE2_INSTALLED,
                                       reason="ctranslate2 is not installed (the `ct2` extra)")


def thresholds(**export):
    return parse({"export": export}).export


def direction_report(share: float, bleu_delta: float, n: int = 32) -> dict:
    """One direction's parity report as parity.check_parity writes it: ONNX at parity, CTranslate2 as given."""
    return {"n_sentences": n, "identical_share": 1.0, "emitted_pad": False,
            "bleu": {"pytorch": 30.0, "onnx": 30.0, "delta": 0.0},
            "ctranslate2": {"identical_share": share, "bleu": 30.0 + bleu_delta, "bleu_delta": bleu_delta}}


# --------------------------------------------------------------------------------------------------- the gate


def test_ctranslate2_outputs_below_its_threshold_fail_naming_the_parameter_and_the_figures():
    failures = parity_failures(direction_report(0.0, -40.34, n=16), thresholds())
    assert failures == [
        "ctranslate2 greedy outputs identical to PyTorch for 0.00% of 16 sentences < "
        "export.ctranslate2_min_identical 80.00%",
        "ctranslate2 greedy BLEU differs from PyTorch by 40.34 > export.ctranslate2_max_bleu_delta 1.00",
    ]


def test_ctranslate2_is_held_to_its_own_thresholds_not_the_onnx_graphs():
    # 95% identical passes its 80% although the ONNX graphs' min_identical is 99%; a BLEU gain is a difference too.
    defaults = thresholds()
    assert defaults.min_identical == 0.99 and defaults.ctranslate2_min_identical == 0.8
    assert parity_failures(direction_report(0.95, -0.5), defaults) == []
    assert len(parity_failures(direction_report(0.95, 2.0), defaults)) == 1
    strict = thresholds(ctranslate2_min_identical=0.99, ctranslate2_max_bleu_delta=0.1)
    assert len(parity_failures(direction_report(0.95, -0.5), strict)) == 2
    assert parity_failures(direction_report(1.0, 0.0), strict) == []


def test_an_export_without_ctranslate2_is_not_held_to_its_thresholds():
    report = direction_report(0.0, -50.0)
    del report["ctranslate2"]
    assert ctranslate2_failures(report, thresholds()) == [] == parity_failures(report, thresholds())


def test_a_nan_bleu_delta_fails():
    assert len(ctranslate2_failures(direction_report(1.0, float("nan")), thresholds())) == 1


def test_the_failure_message_names_each_direction_and_says_once_what_to_do():
    report = {"directions": {"en-de": direction_report(0.5, -3.0), "en-fr": direction_report(1.0, 0.0)}}
    message = gate_message(report, thresholds(), start_row_norm=0.53)
    assert message.startswith("parity gate failed: en-de: ctranslate2 greedy outputs identical to PyTorch for "
                              "50.00% of 32 sentences")
    assert "en-fr" not in message
    assert message.count("dvc repro train") == 1
    assert gate_message({"directions": {"en-de": direction_report(1.0, 0.0)}}, thresholds(), 0.53) is None


def test_the_fix_names_a_nonzero_pad_row_else_the_quantisation_else_the_converter():
    assert "not zero (norm 0.53)" in ctranslate2_fix("int8", 0.53)
    assert "starts Marian's decoder from a zero vector" in ctranslate2_fix("float32", 0.53)
    int8 = ctranslate2_fix("int8", 0.0)
    assert "in int8" in int8 and "export.ctranslate2_quantization" in int8
    assert "export.ctranslate2_min_identical" in int8
    assert "export.ctranslate2: false" in ctranslate2_fix("float32", None)


def test_on_an_x86_cpu_without_vnni_the_int8_fix_says_the_cpu_is_part_of_it():
    for quantization in ("int8", "int8_float32"):
        assert "an x86 CPU without VNNI" in ctranslate2_fix(quantization, None, int8_saturates=True)
        assert "VNNI" not in ctranslate2_fix(quantization, None, int8_saturates=False)
    assert "VNNI" not in ctranslate2_fix("float16", None, int8_saturates=True)
    report = {"directions": {"en-de": direction_report(0.6, -2.0)}}
    assert "an x86 CPU without VNNI" in gate_message(report, thresholds(ctranslate2_quantization="int8"), None, True)


def test_a_students_gate_names_its_own_thresholds_and_its_own_training_stage():
    from pipeline.artifacts import Paths

    student = Paths().student()
    report = {"directions": {"en-de": {**direction_report(0.5, -3.0), "identical_share": 0.5,
                                       "onnx": {"decoder_max_abs_diff": 0.5}}}}
    message = gate_message(report, thresholds(), 0.53, False, student.section("export"), student.stage("train"))
    for key in ("max_logit_diff", "min_identical", "ctranslate2_min_identical", "ctranslate2_max_bleu_delta"):
        assert f"distill.export.{key}" in message
    assert " export." not in message and "(export." not in message
    assert "`dvc repro student_train`" in message
    teacher = gate_message(report, thresholds(), 0.53)
    assert "< export.min_identical" in teacher and "`dvc repro train`" in teacher


# --------------------------------------------------------------------------------------------------- the rows


@needs_ctranslate2
@pytest.mark.parametrize("family", ["opus-mt", "opus-mt-multi", "marian-multi", "mbart", "mbart50", "m2m100", "nllb"])
def test_training_keeps_at_zero_exactly_the_rows_ctranslate2_replaces_with_a_zero_start(family, tiny_checkpoint):
    """CTranslate2's converter (its own spec, read before it is written) starts only Marian's decoder from a zero
    vector and drops only Marian's last (<pad>) row; zero_start_rows names Marian's <pad> rows and nothing else,
    and start_row_norm, which the gate's advice reads, is None for the others."""
    from transformers import AutoModelForSeq2SeqLM

    from stages.export.ctranslate2_model import _stated_converter, start_row_norm
    from stages.train.model import zero_start_rows

    directory = tiny_checkpoint(family)
    model = AutoModelForSeq2SeqLM.from_pretrained(directory)
    pad = model.config.pad_token_id
    spec = _stated_converter(directory)._load()
    marian = model.config.model_type == "marian"
    assert spec.decoder.start_from_zero_embedding is marian
    rows = model.get_input_embeddings().num_embeddings
    assert spec.decoder.embeddings.weight.shape[0] == rows - marian
    kept = zero_start_rows(model, pad)
    assert len(kept) == marian
    if marian:
        assert pad == rows - 1  # the row the converter drops is <pad>
        assert kept[0].data_ptr() == model.get_input_embeddings().weight[pad].data_ptr()
        assert start_row_norm(model, pad) == 0.0
    else:
        assert start_row_norm(model, pad) is None
