"""The evaluate stage: beam search on every test set of every direction, BLEU/chrF/TER with signatures keyed by test
set and direction (and their macro average), hypotheses, a per-sentence table, a markdown report of the best and
worst sentences and the same as a page that loads nothing.

One module-scoped run of the stage on the untrained one-direction tiny model (two small test sets, beam 2) serves
the file assertions; another on an untrained tiny en-de + en-fr model whose tokenizer has the target tags, with
the source rows its model is given recorded, serves the multi-direction ones; the scoring helpers are pinned on
hand-made sentences.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from pipeline.artifacts import Paths, read_json
from pipeline.corpus import read_pairs_by_direction
from pipeline.errors import MissingArtifact
from pipeline.params import MACRO, parse
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.model_languages import LANGUAGES_FILE, ModelLanguages
from stages import evaluate
from stages.evaluate.length_plot import length_bins, length_plot_svg, nice_step
from stages.evaluate.report_html import html_report
from stages.evaluate.report_markdown import markdown_report
from stages.evaluate.results import DirectionResult
from tests.conftest import multi30k_lines, write_clean_splits, write_marian_languages, write_pair_parquet
from tests.page_check import check_page, find_chromium
from tests.support.export_helpers import one_torch_thread
from tests.support.tagged_model import tagged_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("torch_on_one_thread")]

TEST_SETS = {"test": 10, "test_b": 6}
ENTRY_KEYS = {"bleu", "chrf", "ter", "signature", "length_ratio", "sentences"}
EVALUATE = {"evaluate": {"beam": 2, "report_sentences": 3, "max_len_b": 5}}


def write_test_split(source: Path, target: Path, start: int, rows: int) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(source).slice(start, rows)
    pq.write_table(table, target)


@pytest.fixture(scope="module")
def evaluated(tiny_model_dir, tmp_path_factory):
    paths = Paths(tmp_path_factory.mktemp("evaluate"))
    shutil.copytree(tiny_model_dir, paths.final_model)
    if not (paths.final_model / LANGUAGES_FILE).exists():
        write_marian_languages(paths.final_model, ["en-de"])
    paths.clean.mkdir(parents=True)
    clean = tiny_model_dir.parent.parent / "data" / "clean"
    for split in ("train", "valid"):
        shutil.copy2(clean / f"{split}.parquet", paths.clean)
    start = 0
    for split, rows in TEST_SETS.items():
        write_test_split(clean / "test.parquet", paths.split_file(paths.clean, split), start, rows)
        start += rows
    with one_torch_thread():
        summary = evaluate.run(parse(EVALUATE), paths)
    return paths, summary


class RecordingModel:
    """The model, recording every source row (padding dropped) `generate` is given."""

    def __init__(self, model):
        self.model = model
        self.sources: list[list[int]] = []

    def generate(self, input_ids, attention_mask, **kwargs):
        self.sources += [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask, strict=True)]
        return self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


# en-de and en-fr in `test` (6 rows each); en-fr only in `test_fr` (4 rows)
MULTI = ("en-de", "en-fr")
MULTI_TEST_SETS = {"test": {"en-de": 6, "en-fr": 6}, "test_fr": {"en-fr": 4}}


@pytest.fixture(scope="module")
def evaluated_multi(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate_multi")
    tagged_tiny_model(root, MULTI, {"train": 300, "valid": 10, "test": 6})
    paths = Paths(root)
    english, french = (multi30k_lines("test_2016_flickr", lang)[10:14] for lang in ("en", "fr"))
    test_fr = list(zip(english, french, strict=True))
    write_pair_parquet(paths.split_file(paths.clean, "test_fr"), test_fr, "test_2016_flickr.en", "en-fr")
    recorder: list[tuple[RecordingModel, object]] = []

    def load_recording(model_dir):
        model, tokenizer = real_load(model_dir)
        recorder.append((RecordingModel(model), tokenizer))
        return recorder[-1]

    real_load = evaluate.load_model
    with pytest.MonkeyPatch.context() as patch, one_torch_thread():
        patch.setattr(evaluate, "load_model", load_recording)
        summary = evaluate.run(parse(EVALUATE), paths)
    return paths, summary, recorder[0]


def read_table(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def mean_of(entries: list[dict]) -> dict[str, float]:
    return {key: round(sum(e[key] for e in entries) / len(entries), 2) for key in ("bleu", "chrf", "ter")}


def reports(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# --------------------------------------------------------------------------------------------------- the stage


def test_eval_json_holds_bleu_chrf_ter_and_signatures_for_every_test_set_keyed_by_direction(evaluated):
    paths, summary = evaluated
    metrics = read_json(paths.metrics("eval"))
    assert list(metrics) == [*TEST_SETS, MACRO]
    for split, rows in TEST_SETS.items():
        assert list(metrics[split]) == ["en-de"]  # keyed by direction also for one: `test.en-de.bleu`
        scores = metrics[split]["en-de"]
        assert set(scores) == ENTRY_KEYS  # no timing: the file is the same for every run of the model
        assert scores["sentences"] == rows
        assert 0 <= scores["bleu"] <= 100 and 0 <= scores["chrf"] <= 100 and scores["ter"] >= 0
        assert "tok:13a" in scores["signature"]["bleu"] and "case:mixed" in scores["signature"]["bleu"]
        assert "nc:6" in scores["signature"]["chrf"]
        assert "case:mixed" in scores["signature"]["ter"] and "tok:tercom" in scores["signature"]["ter"]
    entries = [metrics[split]["en-de"] for split in TEST_SETS]
    assert metrics[MACRO] == mean_of(entries)
    assert summary == {**{f"{split}.en-de.bleu": metrics[split]["en-de"]["bleu"] for split in TEST_SETS},
                       **{f"macro.{key}": value for key, value in metrics[MACRO].items()}}


def test_scores_are_sacrebleus_on_the_written_hypotheses_and_references(evaluated):
    from sacrebleu.metrics import BLEU, CHRF, TER

    from pipeline.corpus import read_pairs

    paths, _ = evaluated
    metrics = read_json(paths.metrics("eval"))
    for split, rows in TEST_SETS.items():
        hyps = (paths.eval_dir / f"{split}.en-de.hyp.txt").read_text(encoding="utf-8").split("\n")
        assert hyps[-1] == "" and len(hyps) == rows + 1
        _, refs = read_pairs(paths.split_file(paths.clean, split))
        scores = metrics[split]["en-de"]
        assert scores["bleu"] == round(BLEU().corpus_score(hyps[:-1], [refs]).score, 2)
        assert scores["chrf"] == round(CHRF().corpus_score(hyps[:-1], [refs]).score, 2)
        assert scores["ter"] == round(TER(case_sensitive=True).corpus_score(hyps[:-1], [refs]).score, 2)


def test_the_sentence_table_has_src_ref_hyp_and_sentence_bleu_in_test_set_order(evaluated):
    from pipeline.corpus import read_pairs

    paths, _ = evaluated
    for split, rows in TEST_SETS.items():
        table = read_table(paths.eval_dir / f"{split}.en-de.sentences.tsv")
        sources, refs = read_pairs(paths.split_file(paths.clean, split))
        hyps = (paths.eval_dir / f"{split}.en-de.hyp.txt").read_text(encoding="utf-8").splitlines()
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
        scores = metrics[split]["en-de"]
        assert f"| {split} | en-de | {scores['sentences']} | {scores['bleu']:.2f} |" in report
        assert f"## {split}, en-de" in report
    assert f"| macro | mean of 2 | | {metrics[MACRO]['bleu']:.2f} |" in report
    assert report.count("Best 3 by sentence BLEU") == report.count("Worst 3 by sentence BLEU") == len(TEST_SETS)
    assert metrics["test"]["en-de"]["signature"]["ter"] in report


def test_a_sentences_translation_does_not_depend_on_the_sentences_batched_with_it(tiny_model_dir):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # The untrained model never ends on its own, so every output length is its sentence's own limit.
    sentences = ["Two dogs.", "A woman in a red coat rides her bike down a long and busy city street.", "Hi"]
    cfg = parse({"evaluate": {"beam": 2}}).evaluate
    layout = ModelLanguages.read(tiny_model_dir).layout("en-de")
    with one_torch_thread():
        together = evaluate.translate(model, tokenizer, layout, sentences, cfg, progress_bar=False)
        alone = [evaluate.translate(model, tokenizer, layout, [s], cfg, progress_bar=False)[0] for s in sentences]
    assert together == alone
    lengths = [len(tokenizer(text_target=t)["input_ids"]) for t in together]
    assert lengths[0] < lengths[1]


def test_a_missing_final_model_names_the_train_stage(tmp_path):
    with pytest.raises(MissingArtifact, match="it is produced by the 'train' stage"):
        evaluate.run(parse({}), Paths(tmp_path))


# --------------------------------------------------------------------------------------------------- directions


def test_every_direction_of_every_test_set_is_scored_and_macro_is_their_mean(evaluated_multi):
    paths, summary, _ = evaluated_multi
    metrics = read_json(paths.metrics("eval"))
    assert list(metrics) == [*MULTI_TEST_SETS, MACRO]
    entries = []
    for split, directions in MULTI_TEST_SETS.items():
        assert list(metrics[split]) == list(directions)
        for direction, rows in directions.items():
            scores = metrics[split][direction]
            assert set(scores) == ENTRY_KEYS and scores["sentences"] == rows
            entries.append(scores)
    assert len(entries) == 3
    assert metrics[MACRO] == mean_of(entries)
    assert set(summary) == {"test.en-de.bleu", "test.en-fr.bleu", "test_fr.en-fr.bleu", "macro.bleu", "macro.chrf",
                            "macro.ter"}


def test_each_source_reaches_the_model_as_its_targets_tag_then_the_texts_own_ids(evaluated_multi):
    paths, _, (model, tokenizer) = evaluated_multi
    expected = []
    for split in MULTI_TEST_SETS:
        for direction, (_, sources, _) in read_pairs_by_direction(paths.split_file(paths.clean, split)).items():
            tag_id = tokenizer.convert_tokens_to_ids(f">>{direction.split('-')[1]}<<")
            assert tag_id != tokenizer.unk_token_id
            # the tag as one token, then exactly the tokenizer's ids of the untagged source (its </s> last)
            expected += [[tag_id, *tokenizer(source).input_ids] for source in sources]
    assert sorted(model.sources) == sorted(expected)


def test_the_sentence_tables_and_hypotheses_are_per_direction_with_untagged_sources(evaluated_multi):
    paths, _, _ = evaluated_multi
    for split, directions in MULTI_TEST_SETS.items():
        grouped = read_pairs_by_direction(paths.split_file(paths.clean, split))
        for direction, rows in directions.items():
            table = read_table(paths.eval_dir / f"{split}.{direction}.sentences.tsv")
            hyps = (paths.eval_dir / f"{split}.{direction}.hyp.txt").read_text(encoding="utf-8").splitlines()
            _, sources, refs = grouped[direction]
            assert [r["src"] for r in table] == sources and [r["ref"] for r in table] == refs
            assert [r["hyp"] for r in table] == hyps and len(hyps) == rows
    assert not (paths.eval_dir / "test_fr.en-de.hyp.txt").exists()


def test_the_reports_list_scores_and_best_and_worst_sentences_per_direction(evaluated_multi):
    from pipeline.offline_pages import page_references

    paths, _, _ = evaluated_multi
    metrics = read_json(paths.metrics("eval"))
    report = (paths.eval_dir / "report.md").read_text(encoding="utf-8")
    html = (paths.eval_dir / "index.html").read_text(encoding="utf-8")
    for split, directions in MULTI_TEST_SETS.items():
        for direction in directions:
            scores = metrics[split][direction]
            assert f"| {split} | {direction} | {scores['sentences']} | {scores['bleu']:.2f} |" in report
            assert f"## {split}, {direction}" in report
            assert f'<section id="{split}.{direction}"><h2>{split}, {direction}</h2>' in html
            assert f'href="#{split}.{direction}"' in html and f'href="{split}.{direction}.sentences.tsv"' in html
    assert f"| macro | mean of 3 | | {metrics[MACRO]['bleu']:.2f} | {metrics[MACRO]['chrf']:.2f} |" in report
    # Best and worst are up to 3 each and never share a sentence: a direction of 4 sentences lists 2 and 2.
    best = re.compile(r"Best [23] by sentence BLEU")
    assert len(best.findall(report)) == len(best.findall(html)) == 3
    assert html.count('<svg class="length-plot"') == 3 and html.count('<circle class="dot"') == 16
    assert page_references(paths.eval_dir / "index.html") == []


def test_a_second_run_writes_the_same_reports_byte_for_byte(evaluated_multi):
    paths, _, _ = evaluated_multi
    before, metrics = reports(paths.eval_dir), paths.metrics("eval").read_bytes()
    with one_torch_thread():
        evaluate.run(parse(EVALUATE), paths)
    assert reports(paths.eval_dir) == before and paths.metrics("eval").read_bytes() == metrics


def fake_model_dir(paths: Paths, directions: list[str] | None) -> None:
    """A models/final the stage checks before loading anything: config.json and, unless None, languages.json."""
    paths.final_model.mkdir(parents=True)
    (paths.final_model / "config.json").write_text(json.dumps({"model_type": "marian"}))
    if directions is not None:
        write_marian_languages(paths.final_model, directions)


def test_a_direction_the_model_does_not_translate_is_named_before_anything_is_decoded(tmp_path, monkeypatch):
    paths = Paths(tmp_path)
    fake_model_dir(paths, ["en-de", "en-fr"])
    write_clean_splits(tmp_path, {"test": 3}, ("en-de", "de-en"))

    def never(_):
        raise AssertionError("the model was loaded before the test sets were checked")

    monkeypatch.setattr(evaluate, "load_model", never)
    with pytest.raises(evaluate.UntranslatedDirection) as raised:
        evaluate.run(parse({}), paths)
    message = str(raised.value)
    assert "test.parquet" in message and "de-en (3 rows)" in message and "en-de, en-fr" in message
    assert "en-de (" not in message
    assert not paths.eval_dir.exists() and not paths.metrics("eval").exists()


def test_a_model_without_its_languages_file_names_it(tmp_path):
    paths = Paths(tmp_path)
    fake_model_dir(paths, None)
    with pytest.raises(PipelineError, match=f"{LANGUAGES_FILE}: not found"):
        evaluate.run(parse({}), paths)


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
    result = DirectionResult("t", "en-de", {**evaluate.score(["a | b"], ["a | b"]), "sentences": 1}, rows)
    report = markdown_report([result], parse({}).evaluate)
    line = next(x for x in report.splitlines() if x.startswith("| 1 |"))
    assert line.count(" | ") == 4 and "a \\| b" in line


def test_eval_json_has_bleus_length_ratio_of_the_written_hypotheses(evaluated):
    from sacrebleu.metrics import BLEU

    from pipeline.corpus import read_pairs

    paths, _ = evaluated
    metrics = read_json(paths.metrics("eval"))
    for split in TEST_SETS:
        hyps = (paths.eval_dir / f"{split}.en-de.hyp.txt").read_text(encoding="utf-8").splitlines()
        _, refs = read_pairs(paths.split_file(paths.clean, split))
        assert metrics[split]["en-de"]["length_ratio"] == round(BLEU().corpus_score(hyps, [refs]).ratio, 3)


def test_the_html_report_shows_every_test_sets_scores_plot_and_sentences_and_loads_nothing(evaluated):
    from pipeline.offline_pages import offline_problems, page_references

    paths, _ = evaluated
    page = paths.eval_dir / "index.html"
    html = page.read_text(encoding="utf-8")
    metrics = read_json(paths.metrics("eval"))
    for split in TEST_SETS:
        scores = metrics[split]["en-de"]
        assert f'<section id="{split}.en-de">' in html
        assert f"{scores['bleu']:.2f}" in html and f"{scores['length_ratio']:.3f}" in html
        assert scores["signature"]["chrf"] in html
        assert f'href="{split}.en-de.sentences.tsv"' in html
    assert html.count('<svg class="length-plot"') == len(TEST_SETS)
    assert html.count('<circle class="dot"') == sum(TEST_SETS.values())
    assert html.count("Best 3 by sentence BLEU") == html.count("Worst 3 by sentence BLEU") == len(TEST_SETS)
    # Nothing to fetch (the links to the stage's own files are followed by a reader, not loaded).
    assert page_references(page) == []
    assert offline_problems(paths.eval_dir, [page]) == []


def test_the_html_report_escapes_sentences():
    rows = evaluate.score_sentences(['<script>alert("x")</script> & co'], ["a < b"], ["a < b"])
    result = DirectionResult("t", "en-de", {**evaluate.score(["a < b"], ["a < b"]), "sentences": 1}, rows)
    html = html_report([result], parse({}).evaluate)
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


def test_best_and_worst_never_list_one_sentence_twice_even_when_every_sentence_scores_the_same():
    rows = [evaluate.ScoredSentence(i, "s", "r", "h", 0.0) for i in range(1, 8)]
    best, worst = evaluate.best_and_worst(rows, 5)
    assert [r.line for r in best] == [1, 2, 3, 4] and [r.line for r in worst] == [5, 6, 7]
    many = [evaluate.ScoredSentence(i, "s", "r", "h", float(i % 3)) for i in range(1, 21)]
    best, worst = evaluate.best_and_worst(many, 5)
    assert len(best) == len(worst) == 5 and not {r.line for r in best} & {r.line for r in worst}


def test_a_report_of_a_run_cut_short_by_its_time_limit_says_so_before_the_scores():
    rows = evaluate.score_sentences(["a"], ["b"], ["b"])
    result = DirectionResult("t", "en-de", {**evaluate.score(["b"], ["b"]), "sentences": 1}, rows)
    warning = "Training was cut short by train.max_minutes (5 min) after 170 of the 1200 planned steps"
    html = html_report([result], parse({}).evaluate, warning)
    assert html.index(warning) < html.index("<h2>Scores</h2>")
    report = markdown_report([result], parse({}).evaluate, warning).splitlines()
    assert report[2] == f"**{warning}**"
    assert warning not in html_report([result], parse({}).evaluate)


@pytest.mark.skipif(find_chromium() is None, reason="needs Chromium (Debian: apt-get install chromium)")
def test_a_300_character_hypothesis_wraps_inside_its_cell_and_the_columns_stay_readable(tmp_path):
    long_hyp = " ".join(["Ein sehr langer Satz mit vielen Wörtern"] * 8)[:300]
    refs = ["Ein Mann in einem blauen Hemd fährt Fahrrad ."] * 6
    rows = evaluate.score_sentences(["A man in a blue shirt rides a bike ."] * 6, refs, [long_hyp] * 6)
    result = DirectionResult("t", "en-de", {**evaluate.score([long_hyp] * 6, refs), "sentences": 6}, rows)
    page = tmp_path / "index.html"
    page.write_text(html_report([result], parse({}).evaluate), encoding="utf-8")
    # Holds only when every sentence table fits its card and no text column is squeezed to a word per line.
    fits = ("[...document.querySelectorAll('table.sentences')].every(t => t.scrollWidth <= t.parentElement.clientWidth"
            " && [...t.rows[1].cells].slice(2).every(c => c.getBoundingClientRect().width > 200))")
    check = check_page(page, ready_expression=fits, timeout_s=10)
    assert check.problems == []
