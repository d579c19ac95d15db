"""reports/eval/index.html: the evaluation as a page to look at, one file that loads nothing (styles inline, plots
as inline SVG), so it reads the same offline, from a DVC cache or attached to a ticket.

At the top, the BLEU, chrF, TER and length ratio of every test set and direction (with their macro average when
there are several); then, per test set and direction, the signatures, sentence BLEU against source length, and the
best and worst sentences with source, reference and hypothesis side by side.
"""

from __future__ import annotations

from html import escape

from pipeline.params import MACRO, EvaluateParams
from stages.evaluate.length_plot import length_plot_svg
from stages.evaluate.results import DirectionResult, macro_average
from stages.evaluate.sentences import ScoredSentence, best_and_worst

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1f2328;
       background: #f6f8fa; }
main { max-width: 1100px; margin: 0 auto; padding: 1.5rem; }
h1 { font-size: 1.6rem; margin: 0 0 .3rem; } h2 { font-size: 1.25rem; margin: 0 0 .8rem; }
h3 { font-size: 1rem; margin: 1.2rem 0 .4rem; }
.note { color: #59636e; margin: 0 0 1rem; font-size: .92rem; }
section { background: #fff; border: 1px solid #d1d9e0; border-radius: 8px; padding: 1rem 1.2rem; margin: 1rem 0; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid #e6eaef; vertical-align: top; }
/* Sentence tables: fixed columns, so a long hypothesis wraps inside its cell instead of widening the table. */
table.sentences { table-layout: fixed; } table.sentences td { overflow-wrap: anywhere; }
table.sentences col.line-number { width: 4rem; } table.sentences col.sentence-bleu { width: 4.5rem; }
.warning { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 8px; padding: .6rem 1rem; }
th { color: #59636e; font-weight: 600; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.tiles { display: flex; gap: .8rem; flex-wrap: wrap; margin-bottom: .6rem; }
.tile { border: 1px solid #d1d9e0; border-radius: 8px; padding: .5rem .9rem; min-width: 7.5rem; }
.tile .value { font-size: 1.6rem; font-weight: 650; font-variant-numeric: tabular-nums; }
.tile .name { color: #59636e; font-size: .8rem; }
code, .sig { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .8rem; }
.sig { color: #59636e; margin: .1rem 0; word-break: break-all; }
.bleu { display: inline-block; min-width: 2.8rem; text-align: right; padding: .05rem .3rem; border-radius: 4px; }
.length-plot { max-width: 100%; height: auto; }
.length-plot .grid { stroke: #eef1f4; } .length-plot .axis { stroke: #8c959f; }
.length-plot .tick, .length-plot .label { fill: #59636e; font-size: 11px; }
.length-plot .dot { fill: #0969da; fill-opacity: .28; }
.length-plot .mean { fill: none; stroke: #cf222e; stroke-width: 2; }
.length-plot .mean-dot { fill: #cf222e; }
.legend { font-size: .8rem; color: #59636e; }
.legend .swatch { display: inline-block; width: .8rem; height: .8rem; border-radius: 50%; vertical-align: -1px; }
"""


def _bleu_badge(bleu: float) -> str:
    """Sentence BLEU on a red (0) to green (100) background, so the tables read at a glance."""
    return f'<span class="bleu" style="background: hsl({1.2 * bleu:.0f} 70% 88%)">{bleu:.1f}</span>'


def _number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _summary_table(results: list[DirectionResult]) -> str:
    # No decoding time here (the log has it): the report is a function of the model and the data only, so two
    # runs of the same model write the same reports/eval, byte for byte.
    # A student's page shows its teacher's BLEU and the difference beside its own.
    student = any("teacher" in r.scores for r in results)
    head = ("<tr><th>test set</th><th>direction</th><th class=num>sentences</th><th class=num>BLEU</th>"
            + ("<th class=num>teacher BLEU</th><th class=num>vs teacher</th>" if student else "")
            + "<th class=num>chrF</th><th class=num>TER</th><th class=num>length ratio</th></tr>")
    rows = [f'<tr><td><a href="#{escape(r.name)}">{escape(r.test_set)}</a></td><td>{escape(r.direction)}</td>'
            f'<td class=num>{r.scores["sentences"]}</td><td class=num>{_number(r.scores["bleu"])}</td>'
            f'{_teacher_cells(r) if student else ""}'
            f'<td class=num>{_number(r.scores["chrf"])}</td><td class=num>{_number(r.scores.get("ter"))}</td>'
            f'<td class=num>{_number(r.scores.get("length_ratio"), 3)}</td></tr>' for r in results]
    if len(results) > 1:
        macro = macro_average(results)
        rows.append(f"<tr><th>{MACRO}</th><th>mean of {len(results)}</th><td></td>"
                    f'<th class=num>{_number(macro["bleu"])}</th>{"<td></td><td></td>" if student else ""}'
                    f'<th class=num>{_number(macro["chrf"])}</th>'
                    f'<th class=num>{_number(macro["ter"])}</th><td></td></tr>')
    return f"<table>{head}{''.join(rows)}</table>"


def _teacher_cells(result: DirectionResult) -> str:
    teacher = result.scores.get("teacher")
    if teacher is None:
        return "<td class=num>n/a</td><td class=num>n/a</td>"
    return (f'<td class=num>{_number(teacher["bleu"])}</td>'
            f'<td class=num>{result.scores["bleu"] - teacher["bleu"]:+.2f}</td>')


def _sentence_table(rows: list[ScoredSentence]) -> str:
    columns = '<colgroup><col class="line-number"><col class="sentence-bleu"><col><col><col></colgroup>'
    head = "<tr><th class=num>line</th><th class=num>BLEU</th><th>source</th><th>reference</th><th>hypothesis</th></tr>"
    body = [f"<tr><td class=num>{r.line}</td><td class=num>{_bleu_badge(r.sentence_bleu)}</td>"
            f"<td>{escape(r.src)}</td><td>{escape(r.ref)}</td><td>{escape(r.hyp)}</td></tr>" for r in rows]
    return f'<table class="sentences">{columns}{head}{"".join(body)}</table>'


def _direction_section(result: DirectionResult, cfg: EvaluateParams) -> str:
    scores, rows, name = result.scores, result.sentences, escape(result.name)
    title = f"{result.test_set}, {result.direction}"
    tiles = [("BLEU", _number(scores["bleu"])), ("chrF", _number(scores["chrf"])), ("TER", _number(scores.get("ter"))),
             ("length ratio", _number(scores.get("length_ratio"), 3)), ("sentences", str(scores["sentences"]))]
    parts = [f'<section id="{name}"><h2>{escape(title)}</h2><div class="tiles">',
             *(f'<div class="tile"><div class="value">{value}</div><div class="name">{label}</div></div>'
               for label, value in tiles), "</div>",
             *(f'<p class="sig">{escape(metric)}: {escape(sig)}</p>'
               for metric, sig in scores.get("signature", {}).items())]
    if rows:
        parts += ["<h3>Sentence BLEU against source length</h3>",
                  length_plot_svg(rows, f"{title}: sentence BLEU against source length"),
                  '<p class="legend"><span class="swatch" style="background:#0969da;opacity:.5"></span> a sentence '
                  '(hover for its line) &nbsp; <span class="swatch" style="background:#cf222e"></span> mean of a '
                  "tenth of the sentences, by length</p>"]
    if rows and cfg.report_sentences:
        best, worst = best_and_worst(rows, cfg.report_sentences)
        parts += [f"<h3>Best {len(best)} by sentence BLEU</h3>", _sentence_table(best),
                  f"<h3>Worst {len(worst)} by sentence BLEU</h3>", _sentence_table(worst)]
    parts.append(f'<p class="note">Every sentence: <a href="{name}.sentences.tsv">{name}.sentences.tsv</a>; the '
                 f'hypotheses: <a href="{name}.hyp.txt">{name}.hyp.txt</a></p></section>')
    return "\n".join(parts)


def html_report(results: list[DirectionResult], cfg: EvaluateParams, warning: str | None = None) -> str:
    """The page; `warning` (training cut short by its time limit) opens it, above the scores."""
    settings = (f"Beam {cfg.beam}, length penalty {cfg.length_penalty}, at most {cfg.max_len_a} x source + "
                f"{cfg.max_len_b} tokens. sacreBLEU on detokenized, cased text; the length ratio is hypothesis over "
                "reference length in BLEU's tokens (below 1, BLEU's brevity penalty applies).")
    sections = [_direction_section(r, cfg) for r in results]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">', "<title>Evaluation</title>",
        # No favicon to fetch: the page loads nothing at all.
        '<link rel="icon" href="data:,">',
        f"<style>{STYLE}</style>", "</head>", "<body><main>", "<h1>Evaluation</h1>",
        f'<p class="warning"><strong>{escape(warning)}</strong></p>' if warning else "",
        f'<p class="note">{escape(settings)}</p>',
        f"<section><h2>Scores</h2>{_summary_table(results)}</section>" if results else "",
        *sections, "</main></body>", "</html>", "",
    ])
