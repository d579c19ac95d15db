"""The figures of a finished run, read from the stages' metrics files in one place for everything that shows them
(`mtpipe summary`, the model card): test scores, how training went, and the export's parity with PyTorch.

Each reader returns None (or an empty list) when its stage has not run yet, so a summary can say what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.artifacts import Paths, read_json


@dataclass(frozen=True)
class ScoredTestSet:
    """One test set's corpus scores (sacreBLEU, cased, detokenized) with their signatures."""

    test_set: str
    bleu: float
    chrf: float
    ter: float | None
    sentences: int
    signatures: dict[str, str]
    # hypothesis length / reference length, in BLEU's tokens (BLEU's brevity penalty applies below 1)
    length_ratio: float | None = None


@dataclass(frozen=True)
class TrainingRun:
    steps: int
    epochs: int | None
    stop_reason: str | None
    seconds: float | None
    parameters: int | None
    processes: int
    device: str
    precision: str | None
    tgt_tokens_per_s: float | None
    best_valid_loss: float | None
    best_valid_bleu: float | None
    final_model: str | None
    device_name: str | None = None  # the accelerator's model, when the train stage records it

    @property
    def hardware(self) -> str:
        device = f"{self.device} ({self.device_name})" if self.device_name else self.device
        return f"{self.processes} x {device}" + (f", {self.precision}" if self.precision else "")


@dataclass(frozen=True)
class ExportParity:
    """How closely the exported graphs follow PyTorch on the parity sentences (export's gate)."""

    sentences: int | None
    formats: list[str]
    identical_share: float | None  # greedy outputs identical to PyTorch's
    max_logit_diff: float | None  # largest max-abs logit difference over the fp32 graphs
    bleu_delta: float | None  # exported minus PyTorch corpus BLEU on the parity sentences
    int8_identical_share: float | None
    int8_bleu_delta: float | None


def scored_test_sets(paths: Paths) -> list[ScoredTestSet]:
    """metrics/eval.json as ScoredTestSets, in its order; [] before the evaluate stage ran."""
    path = paths.metrics("eval")
    if not path.is_file():
        return []
    return [
        ScoredTestSet(
            test_set=name,
            bleu=scores["bleu"],
            chrf=scores["chrf"],
            ter=scores.get("ter"),
            sentences=scores["sentences"],
            signatures=dict(scores.get("signature", {})),
            length_ratio=scores.get("length_ratio"),
        )
        for name, scores in read_json(path).items()
    ]


def training_run(paths: Paths) -> TrainingRun | None:
    path = paths.metrics("train")
    if not path.is_file():
        return None
    m: dict[str, Any] = read_json(path)
    return TrainingRun(
        steps=m["steps"], epochs=m.get("epochs"), stop_reason=m.get("stop_reason"), seconds=m.get("train_seconds"),
        parameters=m.get("parameters"), processes=m.get("processes", 1), device=m.get("device", "?"),
        precision=m.get("precision"), tgt_tokens_per_s=m.get("tgt_tokens_per_s"),
        best_valid_loss=m.get("best_valid_loss"), best_valid_bleu=m.get("best_valid_bleu"),
        final_model=m.get("final_model"), device_name=m.get("device_name"),
    )


def export_parity(paths: Paths) -> ExportParity | None:
    path = paths.metrics("export")
    if not path.is_file():
        return None
    m: dict[str, Any] = read_json(path)
    formats = [name for name in ("onnx", "onnx_int8", "torchscript", "ctranslate2") if name in m]
    return ExportParity(
        sentences=m.get("n_sentences"),
        formats=formats,
        identical_share=m.get("identical_share"),
        max_logit_diff=largest_graph_diff(m),
        bleu_delta=m.get("bleu", {}).get("delta"),
        int8_identical_share=m.get("onnx_int8", {}).get("identical_share"),
        int8_bleu_delta=m.get("onnx_int8", {}).get("bleu_delta"),
    )


def largest_graph_diff(parity: dict[str, Any]) -> float | None:
    """The largest max-abs difference to PyTorch over every checked graph of a parity report (metrics/export.json
    or the manifest's `parity`); None when no graph was checked."""
    diffs = [value for fmt in ("onnx", "torchscript") for key, value in parity.get(fmt, {}).items()
             if key.endswith("_max_abs_diff")]
    return max(diffs) if diffs else None
