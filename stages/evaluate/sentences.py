"""Per-sentence scores of one test set: sentence BLEU for each pair, the table of them, and their ranking."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ScoredSentence:
    line: int  # 1-based position in the test set
    src: str
    ref: str
    hyp: str
    sentence_bleu: float

    @property
    def source_words(self) -> int:
        """The source's length in whitespace-separated words: what the report plots sentence BLEU against."""
        return len(self.src.split())


TABLE_COLUMNS = ("line", "src", "ref", "hyp", "sentence_bleu")


def score_sentences(sources: list[str], refs: list[str], hyps: list[str]) -> list[ScoredSentence]:
    """Sentence BLEU per pair (sacreBLEU with effective order, as sentence-level BLEU needs)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True)
    return [
        ScoredSentence(i, src, ref, hyp, round(bleu.sentence_score(hyp, [ref]).score, 2))
        for i, (src, ref, hyp) in enumerate(zip(sources, refs, hyps, strict=True), start=1)
    ]


def write_sentence_table(path: Path, rows: list[ScoredSentence]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(TABLE_COLUMNS)
        writer.writerows((r.line, r.src, r.ref, r.hyp, f"{r.sentence_bleu:.2f}") for r in rows)


def write_hypotheses(path: Path, hyps: list[str]) -> None:
    """One translation a line, in test-set order: the file sacreBLEU and sacremoses read as `-i`/stdin."""
    path.write_text("".join(f"{hyp}\n" for hyp in hyps), encoding="utf-8")


def best_and_worst(rows: list[ScoredSentence], n: int) -> tuple[list[ScoredSentence], list[ScoredSentence]]:
    """The n highest and the n lowest by sentence BLEU, never one sentence in both (with fewer than 2n rows the
    better half are the best); ties go to the earlier line, so the report is stable, and when every sentence scores
    the same the two lists are still different sentences."""
    ranked = sorted(rows, key=lambda r: (-r.sentence_bleu, r.line))
    best = ranked[: min(n, (len(ranked) + 1) // 2)]
    worst = sorted(ranked[len(best):], key=lambda r: (r.sentence_bleu, r.line))[:n]
    return best, worst
