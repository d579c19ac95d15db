"""The SentencePiece training sample of several languages: per-language quotas by temperature, draws that repeat
only where a language has too few sentences, each distinct sentence counted once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.runtime.errors import InputFileError
from pipeline.runtime.languages import Directions, temperature_shares
from stages.tokenize.sample import balanced_sample, draw_times, language_quotas, row_directions
from tests.conftest import write_pair_parquet

SIZES = {"en": 90_000, "de": 9_000, "hi": 1_000}


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0, 100.0])
def test_quotas_add_up_to_the_total_and_follow_the_temperature_shares(temperature):
    quotas = language_quotas(SIZES, 10_000, temperature)
    shares = temperature_shares(SIZES, temperature)

    assert sum(quotas.values()) == 10_000
    for lang, quota in quotas.items():
        assert abs(quota - shares[lang] * 10_000) < 1, lang


def test_temperature_one_is_proportional_and_a_higher_one_flattens_towards_uniform():
    assert language_quotas(SIZES, 10_000, 1.0) == {"en": 9000, "de": 900, "hi": 100}
    hindi = [language_quotas(SIZES, 10_000, t)["hi"] for t in (1.0, 2.0, 5.0, 100.0)]
    assert hindi == sorted(hindi) and hindi[0] < hindi[-1]
    assert abs(hindi[-1] - 10_000 / 3) < 150  # near uniform


def test_an_empty_language_is_never_drawn():
    quotas = language_quotas({"en": 7, "de": 0, "fr": 4}, 10, 5.0)
    assert quotas["de"] == 0 and sum(quotas.values()) == 10


def test_a_quota_within_the_sentences_draws_without_replacement():
    times = draw_times(1000, 300, np.random.default_rng(1))
    assert set(np.unique(times)) == {0, 1} and times.sum() == 300


def test_a_quota_over_the_sentences_repeats_every_one_evenly():
    times = draw_times(100, 350, np.random.default_rng(1))
    assert times.sum() == 350
    assert set(np.unique(times)) == {3, 4} and np.count_nonzero(times == 4) == 50


def test_draws_are_seeded():
    first, again, other = (draw_times(1000, 300, np.random.default_rng(s)) for s in (7, 7, 8))
    assert np.array_equal(first, again) and not np.array_equal(first, other)


@pytest.fixture
def multi_way(tmp_path: Path) -> Path:
    """en-de (600 pairs, 100 of the German sentences said twice, one English line empty) and en-fr (60 pairs whose
    English is en-de's first 60): English has 599 distinct sentences, German 500, French 60."""
    english = [f"en {i}" for i in range(600)]
    english[599] = ""
    german = [f"de {i % 500}" for i in range(600)]
    de = write_pair_parquet(tmp_path / "de.parquet", list(zip(english, german, strict=True)), "x", "en-de")
    fr = write_pair_parquet(tmp_path / "fr.parquet", [(english[i], f"fr {i}") for i in range(60)], "x", "en-fr")
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.concat_tables([pq.read_table(de), pq.read_table(fr)]), path, row_group_size=256)
    return path


DIRECTIONS = Directions.of(["en-de", "en-fr"])


def test_each_language_counts_its_distinct_sentences_once_from_either_side(multi_way):
    _, summary = balanced_sample(multi_way, DIRECTIONS, 10_000, 5.0, seed=1)
    assert {lang: s["sentences"] for lang, s in summary.items()} == {"en": 599, "de": 500, "fr": 60}
    shares = temperature_shares({"en": 599, "de": 500, "fr": 60}, 5.0)
    assert {lang: s["share"] for lang, s in summary.items()} == {k: round(v, 4) for k, v in shares.items()}


def test_the_sample_holds_each_language_s_quota_and_repeats_only_the_small_one(multi_way):
    sentences, summary = balanced_sample(multi_way, DIRECTIONS, 10_000, 5.0, seed=1)
    drawn = list(sentences)
    total = 599 + 500 + 60  # fewer sentences than input_sentence_size: the sample is as big as the corpus
    quotas = language_quotas({"en": 599, "de": 500, "fr": 60}, total, 5.0)

    assert len(drawn) == total and {lang: s["drawn"] for lang, s in summary.items()} == quotas
    by_language = Counter(s.split()[0] for s in drawn)
    assert by_language == quotas
    assert quotas["fr"] > 60  # the temperature lifts French above its 60 sentences...
    french = Counter(s for s in drawn if s.startswith("fr"))
    assert len(french) == 60 and max(french.values()) - min(french.values()) <= 1  # ...evenly repeated
    assert max(Counter(s for s in drawn if not s.startswith("fr")).values()) == 1  # the others drawn at most once
    assert "" not in drawn


def test_the_sample_is_capped_by_input_sentence_size_and_seeded(multi_way):
    first, _ = balanced_sample(multi_way, DIRECTIONS, 300, 5.0, seed=3)
    again, _ = balanced_sample(multi_way, DIRECTIONS, 300, 5.0, seed=3)
    other, _ = balanced_sample(multi_way, DIRECTIONS, 300, 5.0, seed=4)
    first = list(first)
    assert len(first) == 300 and first == list(again) and first != list(other)


def test_a_row_of_a_direction_the_model_lacks_is_named_with_its_row(multi_way):
    with pytest.raises(InputFileError, match=r"row 600 is a 'en-fr' pair, not one of data.directions \['en-de'\]"):
        balanced_sample(multi_way, Directions.of(["en-de"]), 1000, 5.0, seed=1)


def test_row_directions_index_the_directions_in_params_order():
    batch = pa.record_batch({"src_lang": ["en", "fr", "en"], "tgt_lang": ["fr", "en", "fr"]})
    assert row_directions(batch, ["fr-en", "en-fr"], Path("x.parquet"), 0).tolist() == [1, 0, 1]
    assert row_directions(batch, ["fr-en", "en-fr"], Path("x.parquet"), 0).dtype == np.uint8
