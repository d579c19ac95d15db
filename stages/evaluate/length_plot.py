"""Sentence BLEU against source length, drawn as inline SVG: one dot per sentence (its line, length and score in a
tooltip) and the mean sentence BLEU of each length decile as a line, so a model that falls apart on long
sentences shows at a glance. Plain SVG written here: the page needs no script and no chart library."""

from __future__ import annotations

import math
from html import escape

from stages.evaluate.sentences import ScoredSentence

WIDTH, HEIGHT = 720, 280
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 14, 44
BINS = 10


def nice_step(span: float, max_ticks: int = 8) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that divides `span` into at most `max_ticks` steps."""
    raw = span / max(max_ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def length_bins(rows: list[ScoredSentence], bins: int = BINS) -> list[tuple[float, float, int]]:
    """(mean source words, mean sentence BLEU, sentences) of each of up to `bins` groups of equal size, shortest
    sentences first."""
    ordered = sorted(rows, key=lambda r: (r.source_words, r.line))
    groups = [ordered[len(ordered) * i // bins: len(ordered) * (i + 1) // bins] for i in range(bins)]
    return [(sum(r.source_words for r in g) / len(g), sum(r.sentence_bleu for r in g) / len(g), len(g))
            for g in groups if g]


def length_plot_svg(rows: list[ScoredSentence], title: str) -> str:
    """The plot of one test set as an <svg> element (an empty string for a test set without sentences)."""
    if not rows:
        return ""
    longest = max(r.source_words for r in rows)
    step = nice_step(max(longest, 1))
    x_max = max(step * math.ceil(longest / step), step)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(words: float) -> float:
        return LEFT + plot_w * words / x_max

    def y(bleu: float) -> float:
        return TOP + plot_h * (1 - bleu / 100)

    parts = [f'<svg class="length-plot" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
             f'role="img" aria-label="{escape(title)}">', f"<title>{escape(title)}</title>"]
    for bleu in range(0, 101, 20):
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(bleu):.1f}" y2="{y(bleu):.1f}"/>'
                     f'<text class="tick" x="{LEFT - 6}" y="{y(bleu) + 4:.1f}" text-anchor="end">{bleu}</text>')
    ticks = [step * i for i in range(int(round(x_max / step)) + 1)]
    for words in ticks:
        label = f"{words:g}"
        parts.append(f'<line class="axis" x1="{x(words):.1f}" x2="{x(words):.1f}" y1="{TOP + plot_h}" '
                     f'y2="{TOP + plot_h + 4}"/><text class="tick" x="{x(words):.1f}" y="{TOP + plot_h + 17}" '
                     f'text-anchor="middle">{label}</text>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}"/>')
    parts.append(f'<text class="label" x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle">'
                 "source length (words)</text>")
    parts.append(f'<text class="label" transform="translate(14 {TOP + plot_h / 2}) rotate(-90)" '
                 'text-anchor="middle">sentence BLEU</text>')
    for r in rows:
        parts.append(f'<circle class="dot" cx="{x(r.source_words):.1f}" cy="{y(r.sentence_bleu):.1f}" r="2.6">'
                     f"<title>line {r.line}: {r.source_words} words, BLEU {r.sentence_bleu:.1f}</title></circle>")
    means = length_bins(rows)
    points = " ".join(f"{x(words):.1f},{y(bleu):.1f}" for words, bleu, _ in means)
    parts.append(f'<polyline class="mean" points="{points}"/>')
    for words, bleu, count in means:
        parts.append(f'<circle class="mean-dot" cx="{x(words):.1f}" cy="{y(bleu):.1f}" r="4">'
                     f"<title>{count} sentences of about {words:.0f} words: mean BLEU {bleu:.1f}</title></circle>")
    parts.append("</svg>")
    return "\n".join(parts)
