"""What the validate stage computes before Great Expectations sees a row, without running it: the per-side
measures (word counts as Python's split counts them) and the small file GX loads instead of the text, the seeded
language sample, the directions each split is checked for and the grouping of rows by their own languages. The
stage's runs on corpora are tests/e2e/test_validate.py's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from pipeline.runtime.languages import Direction
from stages.validate.directions import direction_names, directions_to_check, rows_by_direction
from stages.validate.measures import DERIVED_FILE_SCHEMA, language_sample, side_features

REPO = Path(__file__).resolve().parents[2]


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


def test_the_language_sample_is_seeded_and_bounded():
    first = language_sample(1_000_000, 2000, seed=1)
    assert len(first) == 2000 and len(set(first.tolist())) == 2000 and list(first) == sorted(first)
    assert first.tolist() == language_sample(1_000_000, 2000, seed=1).tolist()
    assert first.tolist() != language_sample(1_000_000, 2000, seed=2).tolist()
    assert language_sample(10, 2000, seed=1).tolist() == list(range(10))
    assert len(language_sample(10, 0, seed=1)) == 0


def test_module_imports_without_great_expectations_or_pandas():
    code = "import sys, stages.validate; print(sorted({'great_expectations', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_train_and_valid_are_checked_for_every_direction_and_a_test_split_for_those_it_holds():
    de, fr, it = Direction("en", "de"), Direction("en", "fr"), Direction("en", "it")
    assert directions_to_check("train", {fr: 3}, [de, fr]) == [de, fr]
    assert directions_to_check("valid", {it: 1, de: 2}, [de, fr]) == [de, fr, it]
    assert directions_to_check("test", {fr: 2}, [de, fr]) == [fr]
    assert directions_to_check("test", {}, [de, fr]) == [de, fr]  # an empty test split fails its row counts
    assert directions_to_check("test", {it: 2}, [de, fr]) == [it]


def test_rows_are_grouped_by_their_own_languages_and_a_missing_language_is_a_direction_of_its_own():
    batch = pa.record_batch(
        {"src_lang": ["en", "en", None, "en", "de"], "tgt_lang": ["de", "fr", "de", "de", "en"]},
    )
    groups = rows_by_direction(batch)
    assert {str(d): rows.tolist() for d, rows in groups.items()} == {
        "en-de": [0, 3],
        "en-fr": [1],
        "?-de": [2],
        "de-en": [4],
    }
    assert direction_names(batch).to_pylist() == ["en-de", "en-fr", "?-de", "en-de", "de-en"]
