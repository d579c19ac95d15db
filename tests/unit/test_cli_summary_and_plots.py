"""`mtpipe summary` tells at a glance how the run went and where everything is; `mtpipe plots` writes the training
curves as a page that loads nothing from another host."""

from __future__ import annotations

import json
import re

from pipeline.artifacts import Paths, write_json
from pipeline.offline_pages import page_references
from pipeline.tools.cli import main, summary
from pipeline.tools.plots_page import PLOTS_DIR
from tests.support.run_files import EVAL, EVAL_MULTI, EXPORT, TRAIN, dvclive_project


def test_summary_gives_scores_signatures_training_export_and_pages(tmp_path):
    paths = Paths(tmp_path)
    for name, content in (("eval", EVAL), ("train", TRAIN), ("export", EXPORT)):
        write_json(paths.metrics(name), content)
    (paths.eval_dir).mkdir(parents=True)
    (paths.eval_dir / "index.html").write_text("<p>report</p>")
    text = summary(paths)
    assert ("  newstest2014 en-de         BLEU  27.31   chrF  56.20   TER  60.50   length ratio 0.987   "
            "(3003 sentences)\n") in text
    assert "  macro (mean of 2)          BLEU  29.41   chrF  58.11   TER  55.38\n" in text
    assert f"  signatures: bleu  {EVAL['newstest2014']['en-de']['signature']['bleu']}" in text
    assert ("Training: 1200 steps (max_steps) in 4.8 min on 2 x cuda, bf16; best valid loss 3.21, valid BLEU 24.7"
            in text)
    assert ("Export (onnx, onnx_int8, torchscript): 100.0% of greedy outputs identical to PyTorch, max logit diff "
            "7.0e-07, BLEU delta +0.00; int8: 87.5% identical, BLEU delta -0.12") in text
    assert f"  evaluation report                      {paths.eval_dir / 'index.html'}\n" in text
    assert f"{paths.root / PLOTS_DIR / 'index.html'}  (missing: run `mtpipe plots`)" in text
    assert f"{paths.root / 'models' / 'release'}  (missing)" in text


def test_summary_opens_with_a_warning_when_a_time_limit_cut_training_short(tmp_path):
    paths = Paths(tmp_path)
    for name, content in (("eval", EVAL), ("export", EXPORT),
                          ("train", {**TRAIN, "steps": 170, "stop_reason": "max_minutes", "max_steps": 1200,
                                     "max_minutes": 5})):
        write_json(paths.metrics(name), content)
    assert summary(paths).splitlines()[0] == (
        "WARNING: Training was cut short by train.max_minutes (5 min) after 170 of the 1200 planned steps: these "
        "figures are of a partly trained model, and a faster machine would have trained further.")
    write_json(paths.metrics("train"), TRAIN)
    assert "WARNING" not in summary(paths)


def test_summary_gives_every_direction_of_every_test_set_and_their_macro_average(tmp_path):
    paths = Paths(tmp_path)
    write_json(paths.metrics("eval"), EVAL_MULTI)
    lines = summary(paths).splitlines()
    assert lines[:4] == [
        "Test scores (sacreBLEU, cased, detokenized):",
        "  test en-de                 BLEU  30.12   chrF  58.30   TER  52.00   length ratio 0.990   (1000 sentences)",
        "  test en-fr                 BLEU  40.50   chrF  65.25   TER  41.50   length ratio 1.010   (1000 sentences)",
        "  macro (mean of 2)          BLEU  35.31   chrF  61.78   TER  46.75",
    ]


def test_summary_of_one_entry_has_no_macro_line(tmp_path):
    paths = Paths(tmp_path)
    write_json(paths.metrics("eval"), {"test": {"en-fr": EVAL_MULTI["test"]["en-fr"]},
                                       "macro": {"bleu": 40.5, "chrf": 65.25, "ter": 41.5}})
    text = summary(paths)
    assert "  test en-fr " in text and "macro" not in text


def test_summary_of_an_eval_json_from_before_directions_still_reads(tmp_path):
    paths = Paths(tmp_path)
    write_json(paths.metrics("eval"), {"test": {"bleu": 1.5, "chrf": 20.0, "sentences": 9, "signature": {"bleu": "s"}}})
    assert "  test                       BLEU   1.50   chrF  20.00   (9 sentences)" in summary(paths)


def test_plots_writes_the_training_curves_with_vega_beside_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(dvclive_project(tmp_path))
    assert main(["plots"]) == 0
    page = tmp_path / PLOTS_DIR / "index.html"
    assert f"training curves: {page.resolve()}" in capsys.readouterr().out
    html = page.read_text(encoding="utf-8")
    assert html.count("vegaEmbed(") == 2 and "cdn.jsdelivr.net" not in html
    assert [ref.url for ref in page_references(page)] == [
        "static/web/vega@5.20.2/build/vega.min.js", "static/web/vega-lite@5.2.0/build/vega-lite.min.js",
        "static/web/vega-embed@6.18.2/build/vega-embed.min.js"]
    assert all((page.parent / ref.url).is_file() for ref in page_references(page))
    assert (page.parent / ".gitignore").read_text() == "*\n"


def test_plots_titles_each_chart_by_its_metric_and_shows_no_legend_for_one_revision(tmp_path, monkeypatch):
    monkeypatch.chdir(dvclive_project(tmp_path))
    assert main(["plots"]) == 0
    html = (tmp_path / PLOTS_DIR / "index.html").read_text(encoding="utf-8")
    specs = [json.loads(line.split("var spec = ", 1)[1].rstrip().removesuffix(";"))
             for line in html.splitlines() if "var spec = " in line]
    assert sorted(spec["title"]["text"] for spec in specs) == ["train: loss", "valid: loss"]
    colour_by_revision = re.findall(r'\{"field": "rev"[^{}]*(?:\{[^{}]*\}[^{}]*)*\}', html)
    assert colour_by_revision and all('"legend": null' in encoding for encoding in colour_by_revision)


def test_plots_outside_a_dvc_project_fails_with_dvcs_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["plots", "-o", "out"]) == 1
    assert "mtpipe plots:" in capsys.readouterr().err
