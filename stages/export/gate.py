"""The parity gate: which of the parity check's figures break their `export.*` thresholds, direction by direction
(every direction the model translates must pass on its own sentences; a failure names its direction). Gated: every
fp32 ONNX and TorchScript max abs diff (`export.max_logit_diff`), the share of ONNX greedy outputs identical to
PyTorch's (`export.min_identical`), the BLEU delta (`export.max_bleu_delta`), and <pad> never emitted; the CTranslate2
model's identical share and BLEU delta likewise (`export.ctranslate2_min_identical`,
`export.ctranslate2_max_bleu_delta`: its own, since its default int8 quantisation changes some outputs). The int8
ONNX graphs are reported, not gated: they are quantised from the fp32 graphs the gate checks, while CTranslate2's
own converter rebuilds the model from the checkpoint, and nothing else would catch a conversion that changes it.
A message names each threshold by its full key: `section` is where the thresholds came from (distill.export for a
student), `train_stage` the stage that retrains the model.
"""

from __future__ import annotations

from typing import Any

from pipeline.params import ExportParams


def parity_failures(report: dict[str, Any], thresholds: ExportParams, section: str = "export") -> list[str]:
    """Each broken threshold as 'figure vs threshold'; empty when the gate passes."""
    limit = thresholds.max_logit_diff
    failures = []
    for fmt in ("onnx", "torchscript"):
        for key, value in report.get(fmt, {}).items():
            if key.endswith("_max_abs_diff") and not value <= limit:  # `not <=` also catches NaN
                name = key.removesuffix("_max_abs_diff").replace("_", " ")
                failures.append(f"{fmt} {name} max abs diff {value:.3g} > {section}.max_logit_diff {limit:.3g}")
    share = report.get("identical_share")
    if share is not None and share < thresholds.min_identical:
        failures.append(
            f"onnx greedy outputs identical to PyTorch for {share:.2%} of {report['n_sentences']} sentences "
            f"< {section}.min_identical {thresholds.min_identical:.2%}"
        )
    delta = report.get("bleu", {}).get("delta")
    if delta is not None and not delta <= thresholds.max_bleu_delta:
        failures.append(f"onnx greedy BLEU differs from PyTorch by {delta:.2f} > {section}.max_bleu_delta "
                        f"{thresholds.max_bleu_delta:.2f}")
    if report.get("emitted_pad"):
        failures.append("onnx greedy decoding emitted <pad>")
    return failures + ctranslate2_failures(report, thresholds, section)


def ctranslate2_failures(report: dict[str, Any], thresholds: ExportParams, section: str = "export") -> list[str]:
    """The CTranslate2 model's broken thresholds (its identical share and absolute BLEU delta); empty when it was
    not exported or passes."""
    agreement = report.get("ctranslate2")
    if agreement is None:
        return []
    failures = []
    share, least = agreement["identical_share"], thresholds.ctranslate2_min_identical
    if not share >= least:
        failures.append(f"ctranslate2 greedy outputs identical to PyTorch for {share:.2%} of {report['n_sentences']} "
                        f"sentences < {section}.ctranslate2_min_identical {least:.2%}")
    delta, most = abs(agreement["bleu_delta"]), thresholds.ctranslate2_max_bleu_delta
    if not delta <= most:
        failures.append(f"ctranslate2 greedy BLEU differs from PyTorch by {delta:.2f} > "
                        f"{section}.ctranslate2_max_bleu_delta {most:.2f}")
    return failures


def ctranslate2_fix(quantization: str, start_row_norm: float | None, int8_saturates: bool = False,
                    section: str = "export", train_stage: str = "train") -> str:
    """What to do when the CTranslate2 model fails the gate. `start_row_norm`: the norm of the <pad> embedding row
    a Marian model decodes from (None for the other families), which CTranslate2 replaces with a zero vector.
    `int8_saturates`: this is an x86 CPU without VNNI (pipeline.cpu_features), where an int8 model that passes
    elsewhere may fail: the message says so, so that a failure on one machine is not taken for a broken model."""
    if start_row_norm:
        return (f"models/final is a Marian model whose <pad> embedding row, the one its decoder starts from, is not "
                f"zero (norm {start_row_norm:.3g}), while CTranslate2 starts Marian's decoder from a zero vector: "
                f"train it again (`dvc repro {train_stage}`), which keeps that row at zero")
    if quantization != "float32":
        cpu = ""
        if int8_saturates and "int8" in quantization:
            cpu = (" (and more on this CPU: an x86 CPU without VNNI, whose int8 dot products saturate, so the same "
                   "model may pass on one with AVX512-VNNI or AVX-VNNI)")
        return (f"CTranslate2 runs the model in {quantization}, which changes some outputs{cpu}: convert it in "
                f"float32 ({section}.ctranslate2_quantization), or loosen {section}.ctranslate2_min_identical / "
                f"{section}.ctranslate2_max_bleu_delta")
    return f"CTranslate2's converter does not reproduce this model: export without it ({section}.ctranslate2: false)"


def gate_message(report: dict[str, Any], thresholds: ExportParams, start_row_norm: float | None,
                 int8_saturates: bool = False, section: str = "export", train_stage: str = "train") -> str | None:
    """The ParityFailed message: every direction's broken thresholds, and what to do about CTranslate2's
    (ctranslate2_fix); None when the gate passes."""
    failures = direction_failures(report, thresholds, section)
    if not failures:
        return None
    message = "parity gate failed: " + "; ".join(failures)
    if any(ctranslate2_failures(direction, thresholds) for direction in report["directions"].values()):
        message += ". " + ctranslate2_fix(thresholds.ctranslate2_quantization, start_row_norm, int8_saturates,
                                          section, train_stage)
    return message


def direction_failures(report: dict[str, Any], thresholds: ExportParams, section: str = "export") -> list[str]:
    """Each direction's broken thresholds as 'direction: figure vs threshold' (parity.check_parity's report, whose
    "directions" holds one report per direction); empty when every direction passes."""
    return [f"{name}: {failure}" for name, direction in report["directions"].items()
            for failure in parity_failures(direction, thresholds, section)]
