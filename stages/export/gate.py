"""The parity gate: which of the parity check's figures break their `export.*` thresholds, direction by direction
(every direction the model translates must pass on its own sentences; a failure names its direction).

Gated: every fp32 ONNX and TorchScript max abs diff (`export.max_logit_diff`), the share of ONNX greedy outputs
identical to PyTorch's (`export.min_identical`), the BLEU delta (`export.max_bleu_delta`), and <pad> never emitted.
The int8 graphs and CTranslate2 are reported, not gated: quantisation is expected to change some outputs.
"""

from __future__ import annotations

from typing import Any

from pipeline.params import ExportParams


def parity_failures(report: dict[str, Any], thresholds: ExportParams) -> list[str]:
    """Each broken threshold as 'figure vs threshold'; empty when the gate passes."""
    limit = thresholds.max_logit_diff
    failures = []
    for fmt in ("onnx", "torchscript"):
        for key, value in report.get(fmt, {}).items():
            if key.endswith("_max_abs_diff") and not value <= limit:  # `not <=` also catches NaN
                name = key.removesuffix("_max_abs_diff").replace("_", " ")
                failures.append(f"{fmt} {name} max abs diff {value:.3g} > max_logit_diff {limit:.3g}")
    share = report.get("identical_share")
    if share is not None and share < thresholds.min_identical:
        failures.append(
            f"onnx greedy outputs identical to PyTorch for {share:.2%} of {report['n_sentences']} sentences "
            f"< min_identical {thresholds.min_identical:.2%}"
        )
    delta = report.get("bleu", {}).get("delta")
    if delta is not None and not delta <= thresholds.max_bleu_delta:
        failures.append(f"onnx greedy BLEU differs from PyTorch by {delta:.2f} > max_bleu_delta "
                        f"{thresholds.max_bleu_delta:.2f}")
    if report.get("emitted_pad"):
        failures.append("onnx greedy decoding emitted <pad>")
    return failures


def direction_failures(report: dict[str, Any], thresholds: ExportParams) -> list[str]:
    """Each direction's broken thresholds as 'direction: figure vs threshold' (parity.check_parity's report, whose
    "directions" holds one report per direction); empty when every direction passes."""
    return [f"{name}: {failure}" for name, direction in report["directions"].items()
            for failure in parity_failures(direction, thresholds)]
