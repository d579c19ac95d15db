"""validate stage: a Great Expectations suite over the cleaned splits, with Data Docs and a metrics summary."""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.artifacts import Paths
from pipeline.corpus import PAIR_SCHEMA
from pipeline.errors import MissingArtifact, ValidationFailed
from pipeline.params import Params, parse
from stages import validate
from tests.support.validate_corpus import GOOD_HELDOUT, GOOD_TRAIN, corpus, write_split

pytestmark = pytest.mark.e2e


def tiny_corpus_params(raw: dict | None = None) -> Params:
    """These corpora have a handful of rows: validate.min_rows (100 by default) is 1 unless a test sets it."""
    raw = copy.deepcopy(raw or {})
    raw.setdefault("validate", {}).setdefault("min_rows", 1)
    return parse(raw)


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
    # One direction: one validation result per split, named by its direction.
    assert pages == {"clean-train-en-de.html", "clean-valid-en-de.html", "clean-test-en-de.html"}
    # The derived train file and every temporary directory are gone: reports/ holds only the site.
    assert [p.name for p in report.parent.iterdir()] == ["validation"]

    metrics = metrics_of(paths)
    assert metrics["success"] is True and returned["success"] is True
    assert metrics["rows"] == len(GOOD_TRAIN) + 2 * len(GOOD_HELDOUT)
    assert list(metrics["splits"]) == ["train", "valid", "test"]
    train = metrics["splits"]["train"]
    assert train["rows"] == len(GOOD_TRAIN)
    # row count, direction, 2 not-null, 2 char and 2 word bounds, ratio, copy, unique, control, html, 2 letter
    # shares, 2 script shares, 2 languages
    assert train["evaluated_expectations"] == train["successful_expectations"] == 19
    assert train["language_sample_rows"] == len(GOOD_TRAIN)  # fewer rows than validate.language_sample: all
    assert train["failed_critical"] == train["failed_non_critical"] == []
    assert train["rows_per_direction"] == {"en-de": len(GOOD_TRAIN)}
    assert metrics["splits"]["test"]["evaluated_expectations"] == 4
    assert list(metrics["directions"]) == ["en-de"]
    en_de = metrics["directions"]["en-de"]
    assert en_de["success"] is True and en_de["rows"] == 9 and en_de["failed_critical"] == []
    assert en_de["rows_per_split"] == {"train": 5, "valid": 2, "test": 2} and en_de["evaluated_expectations"] == 27
    assert returned == {k: v for k, v in metrics.items() if k != "splits"}
    messages = [r.getMessage() for r in caplog.records]
    assert any("validated 9 rows of 1 direction(s) in 3 split(s) against 27 expectations" in m for m in messages)
    assert any("en-de: passed, 9 rows (train 5, valid 2, test 2)" in m for m in messages)


def test_duplicate_pairs_fail_the_suite_with_examples(tmp_path):
    paths = corpus(tmp_path, [*GOOD_TRAIN, GOOD_TRAIN[1]])

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params({}), paths)

    message = str(err.value)
    assert "1 critical expectation(s) failed, in direction(s) en-de;" in message
    assert "train en-de: expect_column_values_to_be_in_set on is_duplicate: 1 unexpected (16.67%)" in message
    assert "train.en:6 src='Two children play football.'" in message
    # The report is written before the error, for the user to inspect.
    assert (paths.validation_report / "index.html").is_file()
    metrics = metrics_of(paths)
    assert metrics["success"] is False and metrics["failed_critical"] == 1
    (failure,) = metrics["splits"]["train"]["failed_critical"]
    assert failure["expectation"] == "expect_column_values_to_be_in_set" and failure["column"] == "is_duplicate"
    assert failure["direction"] == "en-de"
    failed = metrics["directions"]["en-de"]["failed_critical"]
    assert failed == ["train: expect_column_values_to_be_in_set on is_duplicate"]
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
        "clean-train-en-de-rows-1-1000.html",
        "clean-train-en-de-rows-1001-2000.html",
        "clean-train-en-de-rows-2001-2500.html",
        "clean-valid-en-de.html",
        "clean-test-en-de.html",
    }
    train = metrics_of(paths)["splits"]["train"]
    assert train["rows"] == 2500 and train["evaluated_expectations"] == 17
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

    assert "train en-de: expect_table_row_count_to_be_between: observed 0 [min_value=1]" in str(err.value)
    train = metrics_of(paths)["splits"]["train"]
    assert train["rows"] == 0 and failed_columns(train) == [None]
    assert (paths.validation_report / "index.html").is_file()


def test_missing_target_in_a_test_split_fails_naming_the_split(tmp_path):
    paths = corpus(tmp_path, GOOD_TRAIN, test=[("A cat sleeps.", None)])

    with pytest.raises(ValidationFailed) as err:
        validate.run(tiny_corpus_params({}), paths)

    assert "test en-de: expect_column_values_to_not_be_null on tgt: 1 unexpected (100.00%)" in str(err.value)
    assert metrics_of(paths)["splits"]["valid"]["success"] is True


def test_missing_train_split_names_the_clean_stage(tmp_path):
    write_split(tmp_path, "valid", GOOD_HELDOUT)

    with pytest.raises(MissingArtifact, match="train.parquet not found.*'clean' stage"):
        validate.run(tiny_corpus_params({}), Paths(tmp_path))


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

    assert "train en-de: expect_column_values_to_be_in_set on src_lang: 4 unexpected (100.00%)" in str(err.value)
    train = metrics_of(paths)["splits"]["train"]
    assert failed_columns(train) == ["src_lang", "tgt_lang"]
    assert train["failed_critical"][0]["examples"][:1] == ["de"]
    assert train["failed_critical"][0]["rows"][0]["src"] == longer[0][1]  # the text, looked up by origin and line


def test_garbled_and_wrong_script_rows_fail_naming_the_column(tmp_path):
    paths = corpus(tmp_path, [*GOOD_TRAIN, ("| 12 | 3.5 | 4.7 |", "| 12 | 3,5 | 4,7 |"), ("A cat.", "Кошка.")])

    with pytest.raises(ValidationFailed):
        validate.run(tiny_corpus_params({"validate": {"language_sample": 0}}), paths)

    train = metrics_of(paths)["splits"]["train"]
    assert failed_columns(train) == ["src_letter_share", "tgt_letter_share", "tgt_script_share"]
    assert [r["line"] for r in train["failed_critical"][2]["rows"]] == [7]


# Several directions in one file, as the clean stage writes them. GX takes seconds a batch (one per split and
# direction), so each corpus below is validated once, by a module fixture, and its tests read the outcome.

FRENCH_TRAIN = [
    ("A dog runs in the park.", "Un chien court dans le parc."),
    ("Two children play football.", "Deux enfants jouent au football."),
    ("The woman reads a book.", "La femme lit un livre."),
    ("Yes.", "Oui, avec plaisir."),
    ("A man rides a red bicycle.", "Un homme fait du vélo rouge."),
]
FRENCH_HELDOUT = [("A cat sleeps.", "Un chat dort."), ("It rains.", "Il pleut.")]
CZECH_HELDOUT = [("A cat sleeps.", "Kočka spí."), ("It rains.", "Prší.")]
# English with German targets, longer than clean.language_id_min_chars so that every side is language-checked.
GERMAN_TARGETS = [
    ("A dog runs across the green park.", "Ein Hund rennt über den grünen Rasen."),
    ("Two children are playing football outside.", "Zwei Kinder spielen draußen Fußball."),
    ("The woman is reading a thick book.", "Die Frau liest ein dickes Buch."),
    ("A man rides his red bicycle to work.", "Ein Mann fährt mit seinem roten Fahrrad zur Arbeit."),
]
ITALIAN = [("A cat sleeps.", "Un gatto dorme."), ("It rains.", "Piove.")]


def multi_params(directions: list[str], raw: dict | None = None) -> Params:
    """Params of several directions (the embedded sample is en-de only, so the source is files; validate reads
    only data/clean)."""
    files = {split: {"pattern": f"corpus/{split}.{{lang}}"} for split in ("train", "valid", "test")}
    return tiny_corpus_params({**(raw or {}), "data": {"source": "files", "files": files, "directions": directions}})


def write_directions(root: Path, split: str, rows: dict[str, list[tuple[str, str]]]) -> None:
    """One split file holding several directions' rows, one direction after another, every direction's rows
    numbered from line 1 of the same origin (as a multi-way corpus's English file serves each direction)."""
    columns: dict[str, list] = {name: [] for name in PAIR_SCHEMA.names}
    for direction, pairs in rows.items():
        src_lang, tgt_lang = direction.split("-")
        columns["src"] += [s for s, _ in pairs]
        columns["tgt"] += [t for _, t in pairs]
        columns["src_lang"] += [src_lang] * len(pairs)
        columns["tgt_lang"] += [tgt_lang] * len(pairs)
        columns["origin"] += [f"{split}.en"] * len(pairs)
        columns["line"] += list(range(1, len(pairs) + 1))
    path = root / "data" / "clean" / f"{split}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns, schema=PAIR_SCHEMA), path)


class Messages(logging.Handler):
    """The stage's log records, for a module fixture (pytest's caplog is per test)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def validated(paths: Paths, params: Params) -> tuple[dict, str | None, list[str]]:
    """(metrics/validation.json, the ValidationFailed message or None, the log) of one validate run."""
    log, handler = logging.getLogger("mtpipe.validate"), Messages()
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        validate.run(params, paths)
        error = None
    except ValidationFailed as err:
        error = str(err)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return metrics_of(paths), error, handler.messages


def page_text(page: Path) -> str:
    """An HTML page's text, tags removed and whitespace collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")).split())


@pytest.fixture(scope="module")
def two_good_directions(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_directions")
    write_directions(root, "train", {"en-de": GOOD_TRAIN, "en-fr": FRENCH_TRAIN})
    for split in ("valid", "test"):
        write_directions(root, split, {"en-de": GOOD_HELDOUT, "en-fr": FRENCH_HELDOUT})
    paths = Paths(root)
    return paths, *validated(paths, multi_params(["en-de", "en-fr"]))


def test_two_good_directions_pass_each_with_its_own_results(two_good_directions):
    _, metrics, error, log = two_good_directions

    assert error is None and metrics["success"] is True
    assert list(metrics["directions"]) == ["en-de", "en-fr"]
    for direction in metrics["directions"].values():
        assert direction["success"] is True and direction["failed_critical"] == direction["failed_non_critical"] == []
        assert direction["rows_per_split"] == {"train": 5, "valid": 2, "test": 2} and direction["rows"] == 9
        assert direction["evaluated_expectations"] == 27 and direction["language_sample_rows"] == 5
    train = metrics["splits"]["train"]
    assert train["rows_per_direction"] == {"en-de": 5, "en-fr": 5} and train["rows"] == 10
    assert train["evaluated_expectations"] == train["successful_expectations"] == 2 * 19
    assert metrics["rows"] == 18 and metrics["evaluated_expectations"] == 2 * 27
    assert any("validated 18 rows of 2 direction(s) in 3 split(s)" in m for m in log)
    assert any("en-fr: passed, 9 rows (train 5, valid 2, test 2)" in m for m in log)


def test_the_data_docs_show_one_validation_result_per_split_and_direction(two_good_directions):
    paths, *_ = two_good_directions
    report = paths.validation_report

    pages = {p.name for p in (report / "validations").rglob("*.html")}
    assert pages == {f"clean-{split}-{d}.html" for split in ("train", "valid", "test") for d in ("en-de", "en-fr")}
    # en-fr's page checks its rows against French; its suite's notes say which rows it holds.
    (french_train,) = (report / "validations").rglob("clean-train-en-fr.html")
    assert "tgt_lang Status Expectation Observed Value values must belong to this set: fr ," in page_text(french_train)
    assert "Data: every en-fr row of" in page_text(report / "expectations" / "train-en-fr.html")


@pytest.fixture(scope="module")
def faulty_directions(tmp_path_factory):
    """en-de is fine; en-fr has 3 training rows (min_rows 4) and none in valid; en-cs's targets are German; en-it
    is not one of data.directions (in train and test)."""
    root = tmp_path_factory.mktemp("faulty_directions")
    train = {"en-de": GOOD_TRAIN, "en-fr": FRENCH_TRAIN[:3], "en-cs": GERMAN_TARGETS, "en-it": ITALIAN}
    write_directions(root, "train", train)
    write_directions(root, "valid", {"en-de": GOOD_HELDOUT, "en-cs": CZECH_HELDOUT})
    write_directions(root, "test", {"en-de": GOOD_HELDOUT, "en-it": ITALIAN})
    paths = Paths(root)
    return paths, *validated(paths, multi_params(["en-de", "en-fr", "en-cs"], {"validate": {"min_rows": 4}}))


def test_the_stage_fails_naming_every_failing_direction(faulty_directions):
    _, metrics, error, log = faulty_directions

    assert error is not None and "critical expectation(s) failed, in direction(s) en-fr, en-cs, en-it;" in error
    assert list(metrics["directions"]) == ["en-de", "en-fr", "en-cs", "en-it"]
    assert metrics["directions"]["en-de"]["success"] is True and metrics["directions"]["en-de"]["rows"] == 9
    assert any("en-de: passed" in m for m in log) and any("en-fr: FAILED" in m for m in log)


def test_a_direction_short_of_rows_fails_naming_it(faulty_directions):
    _, metrics, error, _ = faulty_directions

    assert "train en-fr: expect_table_row_count_to_be_between: observed 3 [min_value=4]" in error
    # Valid must hold every direction: a missing one fails as an empty one.
    assert "valid en-fr: expect_table_row_count_to_be_between: observed 0 [min_value=1]" in error
    french = metrics["directions"]["en-fr"]
    assert french["success"] is False and french["rows_per_split"] == {"train": 3, "valid": 0}
    assert french["failed_critical"] == [
        "train: expect_table_row_count_to_be_between",
        "valid: expect_table_row_count_to_be_between",
    ]


def test_a_direction_whose_target_is_in_another_language_fails_its_language_check(faulty_directions):
    _, metrics, error, _ = faulty_directions

    assert "train en-cs: expect_column_values_to_be_in_set on tgt_lang: 4 unexpected (100.00%)" in error
    failed = metrics["directions"]["en-cs"]["failed_critical"]
    assert failed == ["train: expect_column_values_to_be_in_set on tgt_lang"]
    (failure,) = [f for f in metrics["splits"]["train"]["failed_critical"] if f["direction"] == "en-cs"]
    assert failure["examples"][0] == "de" and failure["kwargs"]["value_set"] == ["cs"]
    # The example is en-cs's row, though en-de's rows have the same origin and line numbers.
    src, tgt = GERMAN_TARGETS[0]
    assert failure["rows"][0] == {"origin": "train.en", "line": 1, "src": src, "tgt": tgt}


def test_rows_of_a_direction_not_in_data_directions_fail(faulty_directions):
    _, metrics, error, _ = faulty_directions

    assert "train en-it: expect_column_values_to_be_in_set on direction: 2 unexpected (100.00%)" in error
    assert "test en-it: expect_column_values_to_be_in_set on direction: 2 unexpected (100.00%)" in error
    assert "train.en:2 src='It rains.' tgt='Piove.'" in error  # looked up among en-it's rows
    italian = metrics["directions"]["en-it"]
    assert italian["rows_per_split"] == {"train": 2, "test": 2}
    assert italian["failed_critical"] == [
        "train: expect_column_values_to_be_in_set on direction",
        "test: expect_column_values_to_be_in_set on direction",
    ]
    (failure,) = [f for f in metrics["splits"]["test"]["failed_critical"] if f["direction"] == "en-it"]
    assert failure["examples"] == ["en-it", "en-it"]
    assert failure["kwargs"]["value_set"] == ["en-de", "en-fr", "en-cs"]


