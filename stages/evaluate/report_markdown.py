"""reports/eval/report.md: the scores of every test set and direction (and their macro average), then, per test set
and direction, the best and worst sentences, as markdown (what `git diff` and `dvc` diffs show between runs;
reports/eval/index.html is the page to look at)."""

from __future__ import annotations

from typing import Any

from pipeline.params import MACRO, EvaluateParams
from stages.evaluate.results import DirectionResult, macro_average
from stages.evaluate.sentences import ScoredSentence, best_and_worst


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ") or " "


def _sentence_rows(rows: list[ScoredSentence]) -> list[str]:
    lines = ["| line | BLEU | source | reference | hypothesis |", "|---:|---:|---|---|---|"]
    lines += [f"| {r.line} | {r.sentence_bleu:.1f} | {_cell(r.src)} | {_cell(r.ref)} | {_cell(r.hyp)} |" for r in rows]
    return lines


def _ratio(scores: dict[str, Any]) -> str:
    return f"{scores['length_ratio']:.3f}" if scores.get("length_ratio") is not None else "n/a"


def _score_rows(results: list[DirectionResult]) -> list[str]:
    lines = ["| test set | direction | sentences | BLEU | chrF | TER | length ratio |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        s = r.scores
        lines.append(f"| {r.test_set} | {r.direction} | {s['sentences']} | {s['bleu']:.2f} | {s['chrf']:.2f} | "
                     f"{s['ter']:.2f} | {_ratio(s)} |")
    if len(results) > 1:
        macro = macro_average(results)
        lines.append(f"| {MACRO} | mean of {len(results)} | | {macro['bleu']:.2f} | {macro['chrf']:.2f} | "
                     f"{macro['ter']:.2f} | |")
    return lines


def markdown_report(results: list[DirectionResult], cfg: EvaluateParams, warning: str | None = None) -> str:
    lines = [
        "# Evaluation",
        "",
        *([f"**{warning}**", ""] if warning else []),
        f"Beam {cfg.beam}, length penalty {cfg.length_penalty}, maximum length {cfg.max_len_a} x source + "
        f"{cfg.max_len_b} tokens. Scores are cased, on detokenized text; the length ratio is hypothesis over "
        "reference length in BLEU's tokens.",
        "",
        *_score_rows(results),
    ]
    if results:
        # One scoring setup for every test set and direction: the signatures are printed once.
        lines += ["", *(f"- {name} signature: `{sig}`" for name, sig in results[0].scores["signature"].items())]
    for r in results:
        if not r.sentences or cfg.report_sentences == 0:
            continue
        best, worst = best_and_worst(r.sentences, cfg.report_sentences)
        lines += ["", f"## {r.test_set}, {r.direction}", "", f"Best {len(best)} by sentence BLEU:", "",
                  *_sentence_rows(best)]
        lines += ["", f"Worst {len(worst)} by sentence BLEU:", "", *_sentence_rows(worst)]
    return "\n".join(lines) + "\n"
