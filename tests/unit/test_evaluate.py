"""The evaluate stage: beam search on every test set, BLEU/chrF/TER with signatures keyed by test set, hypotheses,
a per-sentence table, a markdown report of the best and worst sentences and the same as a page that loads nothing.

One module-scoped run of the stage on the untrained tiny model (two small test sets, beam 2) serves the file
assertions; the scoring helpers are pinned on hand-made sentences.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from pipeline.artifacts import Paths, read_json
from pipeline.errors import MissingArtifact
from pipeline.params import parse
from stages import evaluate
from stages.evaluate.length_plot import length_bins, length_plot_svg, nice_step
from stages.evaluate.report_html import html_report
from stages.evaluate.report_markdown import markdown_report
from tests.unit.export_helpers import one_torch_thread

pytestmark = pytest.mark.usefixtures("torch_on_one_thread")

TEST_SETS = {"test": 10, "test_b": 6}


def write_test_split(source: Path, target: Path, start: int, rows: int) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(source).slice(start, rows)
    pq.write_table(table, target)


@pytest.fixture(scope="module")
def evaluated(tiny_model_dir, tmp_path_factory):
    paths = Paths(tmp_path_factory.mktemp("evaluate"))
    shutil.copytree(tiny_model_dir, paths.final_model)
    paths.clean.mkdir(parents=True)
    clean = tiny_model_dir.parent.parent / "data" / "clean"
    for split in ("train", "valid"):
        shutil.copy2(clean / f"{split}.parquet", paths.clean)
    start = 0
    for split, rows in TEST_SETS.items():
        write_test_split(clean / "test.parquet", paths.split_file(paths.clean, split), start, rows)
        start += rows
    params = parse({"evaluate": {"beam": 2, "report_sentences": 3, "max_len_b": 5}})
    with one_torch_thread():
        summary = evaluate.run(params, paths)
    return paths, summary


def read_table(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


# --------------------------------------------------------------------------------------------------- the stage


def test_eval_json_holds_bleu_chrf_ter_and_their_signatures_for_every_test_set(evaluated):
    paths, summary = evaluated
    metrics = read_json(paths.metrics("eval"))
    assert list(metrics) == list(TEST_SETS)
    for split, rows in TEST_SETS.items():
        scores = metrics[split]
        assert {"bleu", "chrf", "ter", "signature", "sentences", "seconds"} <= set(scores)
        assert scores["sentences"] == rows
        assert 0 <= scores["bleu"] <= 100 and 0 <= scores["chrf"] <= 100 and scores["ter"] >= 0
        assert "tok:13a" in scores["signature"]["bleu"] and "case:mixed" in scores["signature"]["bleu"]
        assert "nc:6" in scores["signature"]["chrf"]
        assert "case:mixed" in scores["signature"]["ter"] and "tok:tercom" in scores["signature"]["ter"]
    assert summary == {f"{split}_bleu": metrics[split]["bleu"] for split in TEST_SETS}


def test_scores_are_sacrebleus_on_the_written_hypotheses_and_references(evaluated):
    from sacrebleu.metrics import BLEU, CHRF, TER

    from pipeline.corpus import read_pairs

    paths, _ = evaluated
    metrics = read_json(paths.metrics("eval"))
    for split, rows in TEST_SETS.items():
        hyps = (paths.eval_dir / f"{split}.hyp.txt").read_text(encoding="utf-8").split("\n")
        assert hyps[-1] == "" and len(hyps) == rows + 1
        _, refs = read_pairs(paths.split_file(paths.clean, split))
        assert metrics[split]["bleu"] == round(BLEU().corpus_score(hyps[:-1], [refs]).score, 2)
        assert metrics[split]["chrf"] == round(CHRF().corpus_score(hyps[:-1], [refs]).score, 2)
        assert metrics[split]["ter"] == round(TER(case_sensitive=True).corpus_score(hyps[:-1], [refs]).score, 2)


def test_the_sentence_table_has_src_ref_hyp_and_sentence_bleu_in_test_set_order(evaluated):
    from pipeline.corpus import read_pairs

    paths, _ = evaluated
    for split, rows in TEST_SETS.items():
        table = read_table(paths.eval_dir / f"{split}.sentences.tsv")
        sources, refs = read_pairs(paths.split_file(paths.clean, split))
        hyps = (paths.eval_dir / f"{split}.hyp.txt").read_text(encoding="utf-8").splitlines()
        assert list(table[0]) == ["line", "src", "ref", "hyp", "sentence_bleu"]
        assert [r["line"] for r in table] == [str(i) for i in range(1, rows + 1)]
        assert [r["src"] for r in table] == sources
        assert [r["ref"] for r in table] == refs
        assert [r["hyp"] for r in table] == hyps
        assert all(0 <= float(r["sentence_bleu"]) <= 100 for r in table)


def test_the_report_gives_the_scores_and_the_best_and_worst_sentences_per_test_set(evaluated):
    paths, _ = evaluated
    report = (paths.eval_dir / "report.md").read_text(encoding="utf-8")
    metrics = read_json(paths.metrics("eval"))
    assert report.startswith("# Evaluation\n")
    assert "Beam 2, length penalty 1.0" in report
    for split in TEST_SETS:
        assert f"| {split} | {metrics[split]['sentences']} | {metrics[split]['bleu']:.2f} |" in report
        assert f"## {split}" in report
    assert report.count("Best 3 by sentence BLEU") == report.count("Worst 3 by sentence BLEU") == len(TEST_SETS)
    assert metrics["test"]["signature"]["ter"] in report


def test_a_sentences_translation_does_not_depend_on_the_sentences_batched_with_it(tiny_model_dir):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # The untrained model never ends on its own, so every output length is its sentence's own limit.
    sentences = ["Two dogs.", "A woman in a red coat rides her bike down a long and busy city street.", "Hi"]
    cfg = parse({"evaluate": {"beam": 2}}).evaluate
    with one_torch_thread():
        together = evaluate.translate(model, tokenizer, sentences, cfg, progress_bar=False)
        alone = [evaluate.translate(model, tokenizer, [s], cfg, progress_bar=False)[0] for s in sentences]
    assert together == alone
    lengths = [len(tokenizer(text_target=t)["input_ids"]) for t in together]
    assert lengths[0] < lengths[1]


def test_a_missing_final_model_names_the_train_stage(tmp_path):
    with pytest.raises(MissingArtifact, match="it is produced by the 'train' stage"):
        evaluate.run(parse({}), Paths(tmp_path))


# --------------------------------------------------------------------------------------------------- helpers


def test_ter_is_cased_like_bleu_and_chrf():
    exact = evaluate.score(["Two dogs run."], ["Two dogs run."])
    lowered = evaluate.score(["two dogs run."], ["Two dogs run."])
    assert exact["ter"] == 0.0 and exact["bleu"] == 100.0
    assert lowered["ter"] > 0 and lowered["bleu"] < 100


def test_sentence_bleu_is_100_for_an_exact_match_and_0_for_an_empty_hypothesis():
    rows = evaluate.score_sentences(["a", "b", "c"], ["Two dogs run .", "A cat sits .", "Hi"],
                                    ["Two dogs run .", "", "Hi"])
    assert [(r.line, r.sentence_bleu) for r in rows] == [(1, 100.0), (2, 0.0), (3, 100.0)]


def test_best_and_worst_rank_by_sentence_bleu_with_ties_to_the_earlier_line():
    rows = [evaluate.ScoredSentence(i, "s", "r", "h", score) for i, score in
            enumerate([10.0, 50.0, 10.0, 90.0, 50.0], start=1)]
    best, worst = evaluate.best_and_worst(rows, 2)
    assert [r.line for r in best] == [4, 2]
    assert [r.line for r in worst] == [1, 3]


def test_the_table_and_the_report_survive_tabs_quotes_and_pipes_in_sentences(tmp_path):
    rows = evaluate.score_sentences(['He said "hi"\tthen left | ok'], ["a | b"], ["a | b"])
    evaluate.write_sentence_table(tmp_path / "t.tsv", rows)
    assert read_table(tmp_path / "t.tsv")[0]["src"] == 'He said "hi"\tthen left | ok'
    report = markdown_report({}, {"t": rows}, parse({}).evaluate)
    line = next(x for x in report.splitlines() if x.startswith("| 1 |"))
    assert line.count(" | ") == 4 and "a \\| b" in line


def test_eval_json_has_bleus_length_ratio_of_the_written_hypotheses(evaluated):
    from sacrebleu.metrics import BLEU

    from pipeline.corpus import read_pairs

    paths, _ = evaluated
    metrics = read_json(paths.metrics("eval"))
    for split in TEST_SETS:
        hyps = (paths.eval_dir / f"{split}.hyp.txt").read_text(encoding="utf-8").splitlines()
        _, refs = read_pairs(paths.split_file(paths.clean, split))
        assert metrics[split]["length_ratio"] == round(BLEU().corpus_score(hyps, [refs]).ratio, 3)


def test_the_html_report_shows_every_test_sets_scores_plot_and_sentences_and_loads_nothing(evaluated):
    from pipeline.offline_pages import offline_problems, page_references

    paths, _ = evaluated
    page = paths.eval_dir / "index.html"
    html = page.read_text(encoding="utf-8")
    metrics = read_json(paths.metrics("eval"))
    for split in TEST_SETS:
        assert f'<section id="{split}">' in html
        assert f"{metrics[split]['bleu']:.2f}" in html and f"{metrics[split]['length_ratio']:.3f}" in html
        assert metrics[split]["signature"]["chrf"] in html
        assert f'href="{split}.sentences.tsv"' in html
    assert html.count('<svg class="length-plot"') == len(TEST_SETS)
    assert html.count('<circle class="dot"') == sum(TEST_SETS.values())
    assert html.count("Best 3 by sentence BLEU") == html.count("Worst 3 by sentence BLEU") == len(TEST_SETS)
    # Nothing to fetch (the links to the stage's own files are followed by a reader, not loaded).
    assert page_references(page) == []
    assert offline_problems(paths.eval_dir, [page]) == []


def test_the_html_report_escapes_sentences():
    rows = evaluate.score_sentences(['<script>alert("x")</script> & co'], ["a < b"], ["a < b"])
    html = html_report({"t": {**evaluate.score(["a < b"], ["a < b"]), "sentences": 1}}, {"t": rows},
                       parse({}).evaluate)
    assert "<script>alert" not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co" in html
    assert "a &lt; b" in html


def test_length_bins_average_equal_groups_from_the_shortest_sentences_up():
    rows = [evaluate.ScoredSentence(i, " ".join(["w"] * words), "r", "h", bleu)
            for i, (words, bleu) in enumerate([(1, 10.0), (2, 20.0), (3, 30.0), (4, 40.0), (10, 0.0)], start=1)]
    assert length_bins(rows, bins=2) == [(1.5, 15.0, 2), (17 / 3, 70 / 3, 3)]
    assert length_bins(rows[:1], bins=10) == [(1.0, 10.0, 1)]


def test_nice_steps_divide_the_axis_into_at_most_eight_ticks():
    assert [nice_step(span) for span in (1, 7, 8, 9, 25, 41, 130)] == [0.2, 1, 1, 2, 5, 10, 20]
    assert all(span / nice_step(span) <= 8 for span in range(1, 500))


def test_the_length_plot_places_a_dot_per_sentence_within_the_axes():
    import re

    rows = [evaluate.ScoredSentence(i, " ".join(["w"] * (i % 30 + 1)), "r", "h", float(i % 101)) for i in range(1, 201)]
    svg = length_plot_svg(rows, "t")
    dots = re.findall(r'<circle class="dot" cx="([\d.]+)" cy="([\d.]+)"', svg)
    assert len(dots) == 200
    assert all(52 <= float(x) <= 720 - 16 and 14 <= float(y) <= 280 - 44 for x, y in dots)
    assert length_plot_svg([], "t") == ""
