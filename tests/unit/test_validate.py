"""validate stage: a Great Expectations suite over the cleaned splits, with Data Docs and a metrics summary."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.artifacts import Paths
from pipeline.errors import MissingArtifact, ValidationFailed
from pipeline.params import Params, parse
from stages import validate
from stages.validate.measures import DERIVED_FILE_SCHEMA, language_sample, side_features
from tests.conftest import write_pair_parquet

REPO = Path(__file__).resolve().parents[2]

GOOD_TRAIN = [
    ("A dog runs in the park.", "Ein Hund rennt im Park."),
    ("Two children play football.", "Zwei Kinder spielen Fußball."),
    ("The woman reads a book.", "Die Frau liest ein Buch."),
    ("Yes.", "Ja, sehr gerne."),  # ratio 3.75 > 3, but the shorter side is under ratio_min_chars
    ("A man rides a red bicycle.", "Ein Mann fährt ein rotes Fahrrad."),
]
GOOD_HELDOUT = [("A cat sleeps.", "Eine Katze schläft."), ("It rains.", "Es regnet.")]


def tiny_corpus_params(raw: dict | None = None) -> Params:
    """These corpora have a handful of rows: validate.min_rows (100 by default) is 1 unless a test sets it."""
    raw = copy.deepcopy(raw or {})
    raw.setdefault("validate", {}).setdefault("min_rows", 1)
    return parse(raw)


def write_split(root: Path, split: str, pairs: list[tuple[str | None, str | None]]) -> None:
    write_pair_parquet(root / "data" / "clean" / f"{split}.parquet", pairs, f"{split}.en")


def corpus(root: Path, train: list, valid: list = GOOD_HELDOUT, test: list = GOOD_HELDOUT) -> Paths:
    write_split(root, "train", train)
    write_split(root, "valid", valid)
    write_split(root, "test", test)
    return Paths(root)


def metrics_of(paths: Paths) -> dict:
    return json.loads(paths.metrics("validation").read_text(encoding="utf-8"))


def failed_columns(summary: dict, kind: str = "failed_critical") -> list[str | None]:
    return [f.get("column") for f in summary[kind]]


def test_clean_pairs_pass_and_data_docs_are_written(tmp_path, caplog):
    paths = corpus(tmp_path, GOOD_TRAIN)
    stale = paths.validation_report / "stale.html"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier run")

    with caplog.at_level(logging.INFO, logger="mtpipe.validate"):
        returned = validate.run(tiny_corpus_params({}), paths)

    report = paths.validation_report
    assert (report / "index.html").is_file()
    assert sorted(p.name for p in report.iterdir()) == ["expectations", "index.html", "static", "validations"]
    pages = {p.name for p in (report / "validations").rglob("*.html")}
    assert pages == {"clean-train.html", "clean-valid.html", "clean-test.html"}
    # The derived train file and every temporary directory are gone: reports/ holds only the site.
    assert [p.name for p in report.parent.iterdir()] == ["validation"]

    metrics = metrics_of(paths)
    assert metrics["success"] is True and returned["success"] is True
    assert metrics["rows"] == len(GOOD_TRAIN) + 2 * len(GOOD_HELDOUT)
    assert list(metrics["splits"]) == ["train", "valid", "test"]
    train = metrics["splits"]["train"]
    assert train["rows"] == len(GOOD_TRAIN)
    # row count, 2 not-null, 2 char and 2 word bounds, ratio, copy, unique, control, html, 2 letter shares,
    # 2 script shares, 2 languages
    assert train["evaluated_expectations"] == train["successful_expectations"] == 18
    assert train["language_sample_rows"] == len(GOOD_TRAIN)  # fewer rows than validate.language_sample: all
    assert train["failed_critical"] == train["failed_non_critical"] == []
    assert metrics["splits"]["test"]["evaluated_expectations"] == 3
    assert returned == {k: v for k, v in metrics.items() if k != "splits"}
    assert any("validated 9 rows in 3 split(s) against 24 expectations" in r.message for r in caplog.records)


def test_duplicate_pairs_fail_the_suite_with_examples(tmp_path):
    paths = corpus(tmp_path, [*GOOD_TRAIN, GOOD_TRAIN[1]])

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params({}), paths)

    message = str(err.value)
    assert "1 critical expectation(s) failed" in message
    assert "train: expect_column_values_to_be_in_set on is_duplicate: 1 unexpected (16.67%)" in message
    assert "train.en:6 src='Two children play football.'" in message
    # The report is written before the error, for the user to inspect.
    assert (paths.validation_report / "index.html").is_file()
    metrics = metrics_of(paths)
    assert metrics["success"] is False and metrics["failed_critical"] == 1
    (failure,) = metrics["splits"]["train"]["failed_critical"]
    assert failure["expectation"] == "expect_column_values_to_be_in_set" and failure["column"] == "is_duplicate"
    assert failure["examples"] == ["Two children play football.\tZwei Kinder spielen Fußball."]
    assert [(r["origin"], r["line"]) for r in failure["rows"]] == [("train.en", 6)]


def synthetic_pairs(n: int) -> list[tuple[str, str]]:
    """n distinct, well-formed pairs (letters only, so every share check passes)."""
    words = ["".join(chr(97 + (i // 26**k) % 26) for k in range(3)) for i in range(n)]
    return [(f"The dog {w} runs far.", f"Der Hund {w} rennt weit.") for w in words]


def test_a_large_split_is_validated_in_chunks_as_one(tmp_path):
    pairs = synthetic_pairs(2500)
    pairs[2099] = pairs[9]  # a duplicate in the third chunk of a pair in the first
    paths = corpus(tmp_path, pairs)
    params = {"validate": {"chunk_rows": 1000, "language_sample": 0, "min_rows": 2600}}

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params(params), paths)

    pages = {p.name for p in (paths.validation_report / "validations").rglob("*.html")}
    assert pages == {
        "clean-train-rows-1-1000.html",
        "clean-train-rows-1001-2000.html",
        "clean-train-rows-2001-2500.html",
        "clean-valid.html",
        "clean-test.html",
    }
    train = metrics_of(paths)["splits"]["train"]
    assert train["rows"] == 2500 and train["evaluated_expectations"] == 16
    failures = {f["expectation"]: f for f in train["failed_critical"]}
    assert set(failures) == {"expect_table_row_count_to_be_between", "expect_column_values_to_be_in_set"}
    # The row count is the split's (not the last chunk's 500) against validate.min_rows.
    count = failures["expect_table_row_count_to_be_between"]
    assert count["observed_value"] == 2500 and count["kwargs"]["min_value"] == 2600
    # The repeat is found across chunks, and reported as the split's row with its text.
    duplicate = failures["expect_column_values_to_be_in_set"]
    assert duplicate["column"] == "is_duplicate" and duplicate["unexpected_count"] == 1
    assert [(r["origin"], r["line"], r["src"]) for r in duplicate["rows"]] == [("train.en", 2100, pairs[9][0])]
    assert "train.en:2100 " in str(err.value)

    # Without the repeat, and with a minimum the split meets, every chunk passes.
    returned = validate.run(
        tiny_corpus_params({"validate": {**params["validate"], "min_rows": 2500}}),
        corpus(tmp_path, synthetic_pairs(2500)),
    )
    assert returned["success"] is True


def test_duplicates_only_warn_when_the_clean_stage_keeps_them(tmp_path):
    paths = corpus(tmp_path, [*GOOD_TRAIN, GOOD_TRAIN[1]])

    validate.run(tiny_corpus_params({"clean": {"deduplicate": False}}), paths)

    assert failed_columns(metrics_of(paths)["splits"]["train"], "failed_non_critical") == ["is_duplicate"]


def test_overlong_row_fails_naming_the_column(tmp_path):
    long_target = "Ein sehr langer Satz, der viel länger ist als erlaubt."
    paths = corpus(tmp_path, [*GOOD_TRAIN, ("A long sentence.", long_target)])

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params({"clean": {"max_chars": 40, "max_length_ratio": 5.0}}), paths)

    message = str(err.value)
    assert "expect_column_values_to_be_between on tgt_chars: 1 unexpected" in message
    assert "max_value=40" in message and "train.en:6 " in message
    assert "src_chars" not in message
    (failure,) = metrics_of(paths)["splits"]["train"]["failed_critical"]
    assert failure["column"] == "tgt_chars" and failure["examples"] == [len(long_target)]


def test_mostly_tolerates_a_share_of_out_of_bounds_rows(tmp_path):
    paths = corpus(tmp_path, [*GOOD_TRAIN, ("A long sentence.", "Ein sehr langer Satz, der viel länger ist.")])

    returned = validate.run(
        tiny_corpus_params({"clean": {"max_chars": 40, "max_length_ratio": 5.0}, "validate": {"mostly": 0.8}}),
        paths
    )

    assert returned["success"] is True


def test_too_many_words_and_a_large_length_ratio_fail(tmp_path):
    paths = corpus(
        tmp_path,
        [
            *GOOD_TRAIN,
            ("one two three four five six seven", "eins zwei"),
            ("Short enough.", "Ein unglaublich langwieriger Übersetzungsversuch."),
        ],
    )

    with pytest.raises(ValidationFailed):
        validate.run(tiny_corpus_params({"clean": {"max_words": 6, "max_length_ratio": 2.0}}), paths)

    train = metrics_of(paths)["splits"]["train"]
    assert failed_columns(train) == ["src_words", "length_ratio"]
    assert [r["line"] for r in train["failed_critical"][1]["rows"]] == [7]


def test_copies_and_control_characters_are_critical(tmp_path):
    paths = corpus(tmp_path, [*GOOD_TRAIN, ("Berlin", "Berlin"), ("zero\u200bwidth", "Null Breite")])

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params({}), paths)

    assert failed_columns(metrics_of(paths)["splits"]["train"]) == ["is_copy", "has_control"]
    assert "src='zero\\u200bwidth'" in str(err.value)  # the invisible character is shown escaped


def test_html_only_warns(tmp_path, caplog):
    paths = corpus(tmp_path, [*GOOD_TRAIN, ("Click <b>here</b> &amp; wait.", "Klicken Sie hier und warten Sie.")])

    with caplog.at_level(logging.WARNING, logger="mtpipe.validate"):
        returned = validate.run(tiny_corpus_params({}), paths)

    assert returned["success"] is True and returned["failed_non_critical"] == 1
    train = metrics_of(paths)["splits"]["train"]
    assert train["failed_critical"] == [] and failed_columns(train, "failed_non_critical") == ["has_html"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("has_html" in w and "train.en:6" in w for w in warnings)


def test_empty_train_split_fails(tmp_path):
    paths = corpus(tmp_path, [])

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params({}), paths)

    assert "train: expect_table_row_count_to_be_between: observed 0 [min_value=1]" in str(err.value)
    train = metrics_of(paths)["splits"]["train"]
    assert train["rows"] == 0 and failed_columns(train) == [None]
    assert (paths.validation_report / "index.html").is_file()


def test_missing_target_in_a_test_split_fails_naming_the_split(tmp_path):
    paths = corpus(tmp_path, GOOD_TRAIN, test=[("A cat sleeps.", None)])

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params({}), paths)

    assert "test: expect_column_values_to_not_be_null on tgt: 1 unexpected (100.00%)" in str(err.value)
    assert metrics_of(paths)["splits"]["valid"]["success"] is True


def test_missing_train_split_names_the_clean_stage(tmp_path):
    write_split(tmp_path, "valid", GOOD_HELDOUT)

    with pytest.raises(MissingArtifact, match="train.parquet not found.*'clean' stage"):
        validate.run(tiny_corpus_params({}), Paths(tmp_path))


def test_word_counts_match_python_split():
    texts = ["a  b", " a\tb\nc ", "a\u00a0b\u3000c", "a\u200bb", "", "\u2028", "x\x1cy", None]
    words = side_features(pa.array(texts, pa.string()), None)["words"]
    assert words.to_pylist() == [None if t is None else len(t.split()) for t in texts]


def test_the_file_gx_loads_holds_measures_only_not_the_text():
    # What keeps validate's memory small: ~50 bytes a pair instead of the text (~1.1 KB a pair in pandas).
    assert not {"src", "tgt"} & set(DERIVED_FILE_SCHEMA.names)
    # Dictionary columns (origin, languages) take a 1-4 byte code a row; the rest have a fixed width.
    fixed_bits = [f.type.bit_width for f in DERIVED_FILE_SCHEMA if not pa.types.is_dictionary(f.type)]
    assert sum(fixed_bits) / 8 <= 50


def test_swapped_columns_fail_the_language_check_with_examples(tmp_path):
    longer = [
        ("A dog runs across the green park.", "Ein Hund rennt über den grünen Rasen."),
        ("Two children are playing football outside.", "Zwei Kinder spielen draußen Fußball."),
        ("The woman is reading a thick book.", "Die Frau liest ein dickes Buch."),
        ("A man rides his red bicycle to work.", "Ein Mann fährt mit seinem roten Fahrrad zur Arbeit."),
    ]
    paths = corpus(tmp_path, [(t, s) for s, t in longer])

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params({}), paths)

    assert "train: expect_column_values_to_be_in_set on src_lang: 4 unexpected (100.00%)" in str(err.value)
    train = metrics_of(paths)["splits"]["train"]
    assert failed_columns(train) == ["src_lang", "tgt_lang"]
    assert train["failed_critical"][0]["examples"][:1] == ["de"]
    assert train["failed_critical"][0]["rows"][0]["src"] == longer[0][1]  # the text, looked up by origin and line


def test_the_language_sample_is_seeded_and_bounded():
    first = language_sample(1_000_000, 2000, seed=1)
    assert len(first) == 2000 and len(set(first.tolist())) == 2000 and list(first) == sorted(first)
    assert first.tolist() == language_sample(1_000_000, 2000, seed=1).tolist()
    assert first.tolist() != language_sample(1_000_000, 2000, seed=2).tolist()
    assert language_sample(10, 2000, seed=1).tolist() == list(range(10))
    assert len(language_sample(10, 0, seed=1)) == 0


def test_garbled_and_wrong_script_rows_fail_naming_the_column(tmp_path):
    paths = corpus(tmp_path, [*GOOD_TRAIN, ("| 12 | 3.5 | 4.7 |", "| 12 | 3,5 | 4,7 |"), ("A cat.", "Кошка.")])

    with pytest.raises(ValidationFailed):
        validate.run(tiny_corpus_params({"validate": {"language_sample": 0}}), paths)

    train = metrics_of(paths)["splits"]["train"]
    assert failed_columns(train) == ["src_letter_share", "tgt_letter_share", "tgt_script_share"]
    assert [r["line"] for r in train["failed_critical"][2]["rows"]] == [7]


def test_module_imports_without_great_expectations_or_pandas():
    code = "import sys, stages.validate; print(sorted({'great_expectations', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
