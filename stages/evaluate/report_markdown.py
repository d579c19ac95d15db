"""reports/eval/report.md: the scores and, per test set, the best and worst sentences, as markdown (what
`git diff` and `dvc` diffs show between runs; reports/eval/index.html is the page to look at)."""

from __future__ import annotations

from typing import Any

from pipeline.params import EvaluateParams
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


def markdown_report(results: dict[str, Any], tables: dict[str, list[ScoredSentence]], cfg: EvaluateParams) -> str:
    lines = [
        "# Evaluation",
        "",
        f"Beam {cfg.beam}, length penalty {cfg.length_penalty}, maximum length {cfg.max_len_a} x source + "
        f"{cfg.max_len_b} tokens. Scores are cased, on detokenized text; the length ratio is hypothesis over "
        "reference length in BLEU's tokens.",
        "",
        "| test set | sentences | BLEU | chrF | TER | length ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {split} | {r['sentences']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['ter']:.2f} | {_ratio(r)} |"
              for split, r in results.items()]
    if results:
        signature = next(iter(results.values()))["signature"]
        lines += ["", *(f"- {name} signature: `{sig}`" for name, sig in signature.items())]
    for split, rows in tables.items():
        if not rows or cfg.report_sentences == 0:
            continue
        best, worst = best_and_worst(rows, cfg.report_sentences)
        lines += ["", f"## {split}", "", f"Best {len(best)} by sentence BLEU:", "", *_sentence_rows(best)]
        lines += ["", f"Worst {len(worst)} by sentence BLEU:", "", *_sentence_rows(worst)]
    return "\n".join(lines) + "\n"
