"""The evaluation's results: one per (test set, direction), and metrics/eval.json made of them.

metrics/eval.json is keyed by test set, then by direction, always (also for one direction), so `dvc metrics diff`
and `dvc exp show` give one column per pair, e.g. `test.en-de.bleu`; `macro` (pipeline.params.MACRO, a name no
split may take) holds the plain mean of every entry's BLEU, chrF and TER:

    {"test": {"en-de": {"bleu", "chrf", "ter", "signature", "length_ratio", "sentences"}, "en-fr": {...}},
     "macro": {"bleu", "chrf", "ter"}}

A distilled student's entries (metrics/student/eval.json) also hold `teacher`: its teacher's bleu, chrf and ter
on the same test set and direction, and so does its macro.

No timings: two runs of one model on one data set write the same file (decoding time goes to the log).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.params import MACRO
from stages.evaluate.sentences import ScoredSentence

AVERAGED = ("bleu", "chrf", "ter")


@dataclass(frozen=True)
class DirectionResult:
    """One direction of one test set: its corpus scores (an eval.json entry) and its scored sentences."""

    test_set: str
    direction: str
    scores: dict[str, Any]
    sentences: list[ScoredSentence]

    @property
    def name(self) -> str:
        """`<test set>.<direction>`: the stem of its files under reports/eval and its anchor in the page."""
        return f"{self.test_set}.{self.direction}"


def macro_average(results: list[DirectionResult]) -> dict[str, float]:
    """The mean of every entry's BLEU, chrF and TER (each entry counts once, whatever its size); {} for none."""
    if not results:
        return {}
    return {key: round(sum(r.scores[key] for r in results) / len(results), 2) for key in AVERAGED}


def eval_json(results: list[DirectionResult]) -> dict[str, Any]:
    """metrics/eval.json's content: {test_set: {direction: scores}, "macro": means}, in the results' order."""
    nested: dict[str, Any] = {}
    for r in results:
        nested.setdefault(r.test_set, {})[r.direction] = r.scores
    if results:
        nested[MACRO] = macro_average(results)
        if all("teacher" in r.scores for r in results):  # a student's evaluation: its teacher's means beside
            nested[MACRO]["teacher"] = {key: round(sum(r.scores["teacher"][key] for r in results) / len(results), 2)
                                        for key in AVERAGED}
    return nested
