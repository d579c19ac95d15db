"""The figures of a finished run, read from the stages' metrics files in one place for everything that shows them
(`mtpipe summary`, the model card): test scores per test set and direction with their macro average, how training
went, and the export's parity with PyTorch; and the summary's lines of test scores.

Each reader returns None (or an empty list) when its stage has not run yet, so a summary can say what is missing.
metrics/eval.json is {test_set: {direction: scores}, "macro": means} (stages/evaluate/results.py); an eval.json
written before directions, {test_set: scores}, still reads, its entries without a direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.artifacts import Paths, read_json
from pipeline.params import MACRO


@dataclass(frozen=True)
class ScoredTestSet:
    """One direction of one test set: its corpus scores (sacreBLEU, cased, detokenized) with their signatures."""

    test_set: str
    direction: str | None  # None in an eval.json written before directions
    bleu: float
    chrf: float
    ter: float | None
    sentences: int
    signatures: dict[str, str]
    # hypothesis length / reference length, in BLEU's tokens (BLEU's brevity penalty applies below 1)
    length_ratio: float | None = None
    # A distilled student's entries: its teacher's BLEU on the same test set and direction.
    teacher_bleu: float | None = None

    @property
    def label(self) -> str:
        """`test en-de`: the test set and its direction, as the summary and the card name an entry."""
        return self.test_set if self.direction is None else f"{self.test_set} {self.direction}"


@dataclass(frozen=True)
class Evaluation:
    """metrics/eval.json: every (test set, direction) entry in the file's order, and the macro average."""

    scored: list[ScoredTestSet]
    macro: dict[str, float] = field(default_factory=dict)  # bleu, chrf, ter; {} in a file without one


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
    max_steps: int | None = None  # the planned updates (train.max_steps)
    max_minutes: float | None = None  # the time limit, when one was set (train.max_minutes)

    @property
    def cut_short(self) -> str | None:
        """One sentence when the time limit, not the plan, ended training (the figures are then of a model trained
        for fewer steps than planned, and depend on the machine's speed); None otherwise."""
        if self.stop_reason != "max_minutes":
            return None
        planned = f" of the {self.max_steps} planned" if self.max_steps is not None else ""
        limit = f" ({self.max_minutes:g} min)" if self.max_minutes is not None else ""
        return (f"Training was cut short by train.max_minutes{limit} after {self.steps}{planned} steps: these figures "
                "are of a partly trained model, and a faster machine would have trained further.")

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


def _scored(test_set: str, direction: str | None, scores: Mapping[str, Any]) -> ScoredTestSet:
    return ScoredTestSet(test_set=test_set, direction=direction, bleu=scores["bleu"], chrf=scores["chrf"],
                         ter=scores.get("ter"), sentences=scores["sentences"],
                         signatures=dict(scores.get("signature", {})), length_ratio=scores.get("length_ratio"),
                         teacher_bleu=scores.get("teacher", {}).get("bleu"))


def evaluation_of(content: Mapping[str, Any]) -> Evaluation:
    """eval.json's content (read from the file, or as `dvc exp show --json` reports it) as an Evaluation."""
    scored = []
    for test_set, entries in content.items():
        if test_set == MACRO:
            continue
        if "bleu" in entries:  # written before directions: the test set's own scores
            scored.append(_scored(test_set, None, entries))
        else:
            scored += [_scored(test_set, direction, scores) for direction, scores in entries.items()]
    return Evaluation(scored=scored, macro=dict(content.get(MACRO, {})))


def read_evaluation(paths: Paths) -> Evaluation | None:
    """metrics/eval.json; None before the evaluate stage ran."""
    path = paths.metrics("eval")
    return evaluation_of(read_json(path)) if path.is_file() else None


def score_lines(paths: Paths) -> list[str]:
    """The summary's test scores: one line per test set and direction, the macro average when there are several,
    and the signatures once."""
    evaluation = read_evaluation(paths)
    if evaluation is None or not evaluation.scored:
        return ["No evaluation yet: run `mtpipe run` (or `dvc repro`)."]
    lines = ["Test scores (sacreBLEU, cased, detokenized):"]
    for s in evaluation.scored:
        ter = f"   TER {s.ter:6.2f}" if s.ter is not None else ""
        ratio = f"   length ratio {s.length_ratio:.3f}" if s.length_ratio is not None else ""
        teacher = (f"   teacher BLEU {s.teacher_bleu:6.2f} ({s.bleu - s.teacher_bleu:+.2f})"
                   if s.teacher_bleu is not None else "")
        lines.append(f"  {s.label:<26} BLEU {s.bleu:6.2f}   chrF {s.chrf:6.2f}{ter}{ratio}   ({s.sentences} sentences)"
                     f"{teacher}")
    macro = evaluation.macro
    if len(evaluation.scored) > 1 and macro:
        label = f"{MACRO} (mean of {len(evaluation.scored)})"
        lines.append(f"  {label:<26} BLEU {macro['bleu']:6.2f}   chrF {macro['chrf']:6.2f}   TER {macro['ter']:6.2f}")
    # The signatures are the same for every entry: one scoring setup, printed once.
    for i, (metric, signature) in enumerate(evaluation.scored[0].signatures.items()):
        lines.append(f"  {'signatures:' if i == 0 else '':<11} {metric:<5} {signature}")
    return lines


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
        final_model=m.get("final_model"), device_name=m.get("device_name"), max_steps=m.get("max_steps"),
        max_minutes=m.get("max_minutes"),
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
