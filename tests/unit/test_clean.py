"""clean stage: every split normalised, training pairs filtered, every rejected row kept with its reason."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import corpus
from pipeline.artifacts import Paths
from pipeline.errors import InputFileError, MissingArtifact, PipelineError
from pipeline.params import parse
from pipeline.text_checks import HashSet64
from stages import clean
from tests.conftest import write_pair_parquet

GOOD_TRAIN = [
    ("A dog runs in the park.", "Ein Hund rennt im Park."),
    ("Two children play football.", "Zwei Kinder spielen Fußball."),
    ("The woman reads a book.", "Die Frau liest ein Buch."),
    ("No way.", "Auf keinen Fall, nein."),  # ratio 3.14, but the shorter side is under ratio_min_chars: kept
]
VALID = [("It rains.", "Es regnet."), ("The bus is late.", "Der Bus ist spät.")]
TEST = [("A bird sings.", "Ein Vogel singt."), ("Snow falls.", "Schnee fällt.")]


def write_raw(root: Path, split: str, pairs: list[tuple[str, str]]) -> Path:
    return write_pair_parquet(root / "data" / "raw" / f"{split}.parquet", pairs, f"{split}.en")


def raw_corpus(root: Path, train: list, valid: list = VALID, test: list = TEST) -> Paths:
    write_raw(root, "train", train)
    write_raw(root, "valid", valid)
    write_raw(root, "test", test)
    return Paths(root)


def pairs_of(paths: Paths, split: str) -> list[tuple[str, str]]:
    table = pq.read_table(paths.split_file(paths.clean, split))
    return list(zip(table.column("src").to_pylist(), table.column("tgt").to_pylist(), strict=True))


def rejected_rows(paths: Paths) -> list[dict]:
    return pq.read_table(paths.rejected).to_pylist()


def clean_metrics(paths: Paths) -> dict:
    return json.loads(paths.metrics("clean").read_text(encoding="utf-8"))


# --- normalisation ----------------------------------------------------------------------------------------------

MESSY_TO_CLEAN = [
    ("Gru\u0308n", "Grün"),  # NFC composes u + combining diaeresis
    ("u\u200b\u0308ber", "über"),  # composes even when a zero-width space sat between letter and mark
    ("zero\u200bwidth\u200dspace", "zerowidthspace"),
    ("\ufeffbom in front", "bom in front"),
    ("bell\x07 and\x1b escape\x7f", "bell and escape"),
    ("tab\tand\u00a0nbsp", "tab and nbsp"),
    ("many     spaces\u2003\u3000here", "many spaces here"),
    ("  \t trimmed ends \u00a0 ", "trimmed ends"),
]


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_every_split_is_normalised(tmp_path, split):
    messy = [(m, f"{m} (de)") for m, _ in MESSY_TO_CLEAN]
    expected = [(c, f"{c} (de)") for _, c in MESSY_TO_CLEAN]
    corpus = {"train": GOOD_TRAIN, "valid": VALID, "test": TEST, split: messy}
    paths = raw_corpus(tmp_path, **corpus)

    clean.run(parse({}), paths)

    assert pairs_of(paths, split) == expected
    for src, tgt in pairs_of(paths, split):
        assert unicodedata.is_normalized("NFC", src) and unicodedata.is_normalized("NFC", tgt)


def test_nfkc_folds_compatibility_characters_when_asked(tmp_path):
    paths = raw_corpus(tmp_path, train=[*GOOD_TRAIN, ("ﬁve ２ cats", "ﬁnf ２ Katzen")])
    clean.run(parse({"clean": {"unicode_form": "NFKC"}}), paths)
    assert pairs_of(paths, "train")[-1] == ("five 2 cats", "finf 2 Katzen")


# --- filters on the training split ------------------------------------------------------------------------------

# (clean params, crafted training pair, reason it is rejected for)
REJECTS = {
    "empty": ({}, ("A lonely source.", "   \u200b ")),
    "too_short_chars": ({"min_chars": 5}, ("Hi.", "Hallo.")),  # "No way." has 7: kept
    "too_short_words": ({"min_words": 2}, ("Hello.", "Guten Tag.")),
    "too_long_chars": ({"max_chars": 40}, ("A sentence that is well beyond forty characters.", "Ein Satz.")),
    "too_long_words": ({"max_words": 6}, ("one two three four five six seven", "eins zwei drei")),
    "length_ratio": ({}, ("A dog.......", "Ein Hund, der sehr schnell durch den großen grünen Park rennt.")),
    "source_equals_target": ({}, ("Berlin Marathon 2024", "Berlin  Marathon 2024")),
    "garbled": ({}, ("| 12 | 3.5 | 4.7 | -- |", "| 12 | 3,5 | 4,7 | -- |")),
    "wrong_script": ({}, ("The cat sleeps on the sofa.", "Кошка спит на диване.")),
    "overlaps_eval": ({}, ("A  bird sings.", "Ein Vogel\tsingt.")),  # equals a test pair once normalised
    "duplicate": ({}, GOOD_TRAIN[1]),
    "wrong_language": (
        {"language_id": True},
        ("The children are playing in the garden.", "Les enfants jouent dans le jardin."),  # French, Latin script
    ),
}


@pytest.mark.parametrize("reason", list(REJECTS))
def test_each_filter_rejects_its_crafted_training_pair_with_its_reason(tmp_path, reason):
    overrides, crafted = REJECTS[reason]
    paths = raw_corpus(tmp_path, train=[*GOOD_TRAIN, crafted])

    metrics = clean.run(parse({"clean": overrides}), paths)

    rows = rejected_rows(paths)
    assert [(r["split"], r["line"], r["reason"]) for r in rows] == [("train", len(GOOD_TRAIN) + 1, reason)]
    assert pairs_of(paths, "train") == GOOD_TRAIN
    assert metrics == {"train_kept": len(GOOD_TRAIN), "train_rejected": 1}
    assert clean_metrics(paths)["splits"]["train"]["reasons"] == {reason: 1}


# Each switchable filter, switched off, keeps the pair it would reject.
SWITCHED_OFF = {
    "source_equals_target": {"reject_copies": False},
    "garbled": {"min_letter_share": 0.0},
    "wrong_script": {"min_script_share": 0.0},
    "overlaps_eval": {"remove_eval_overlap": False},
    "duplicate": {"deduplicate": False},
    "wrong_language": {"language_id": False},
}


@pytest.mark.parametrize("reason", list(SWITCHED_OFF))
def test_a_switched_off_filter_keeps_the_pair_it_would_reject(tmp_path, reason):
    overrides, crafted = REJECTS[reason]
    paths = raw_corpus(tmp_path, train=[*GOOD_TRAIN, crafted])

    clean.run(parse({"clean": {**overrides, **SWITCHED_OFF[reason]}}), paths)

    assert rejected_rows(paths) == []
    assert len(pairs_of(paths, "train")) == len(GOOD_TRAIN) + 1


def test_language_id_is_off_by_default():
    assert parse({}).clean.language_id is False


def test_language_id_leaves_sides_shorter_than_its_minimum_unchecked(tmp_path):
    pair = ("Good morning.", "Bonjour.")  # French target, but 8 characters are too few to judge
    paths = raw_corpus(tmp_path, train=[*GOOD_TRAIN, pair])
    clean.run(parse({"clean": {"language_id": True, "language_id_min_chars": 20}}), paths)
    assert pair in pairs_of(paths, "train")


def test_a_language_the_detector_does_not_know_is_a_clear_error(tmp_path):
    paths = raw_corpus(tmp_path, train=GOOD_TRAIN)
    with pytest.raises(PipelineError, match=r"py3langid does not know the language\(s\) \['xx'\]"):
        clean.run(parse({"clean": {"language_id": True, "language_id_candidates": ["xx"]}}), paths)


def test_script_check_uses_the_script_of_each_side(tmp_path):
    # en-ru: Cyrillic is right on the target side and wrong on the source side.
    good = ("The cat sleeps on the sofa.", "Кошка спит на диване.")
    bad = ("Кошка спит на диване.", "Кошка спит на диване!")
    paths = raw_corpus(tmp_path, train=[good, bad], valid=VALID, test=TEST)
    clean.run(parse({"data": {"tgt_lang": "ru"}}), paths)
    assert pairs_of(paths, "train") == [good]
    assert [r["reason"] for r in rejected_rows(paths)] == ["wrong_script"]


def test_every_reject_reason_the_stage_knows_is_covered_here():
    assert set(REJECTS) == set(clean.REASONS)


def test_the_first_matching_filter_names_the_reason(tmp_path):
    # Both too short and identical on both sides: "too_short_chars" comes first in the documented order.
    paths = raw_corpus(tmp_path, train=[*GOOD_TRAIN, ("OK", "OK")])
    clean.run(parse({"clean": {"min_chars": 3}}), paths)
    assert [r["reason"] for r in rejected_rows(paths)] == ["too_short_chars"]


def test_short_pairs_pass_the_length_ratio_filter_below_ratio_min_chars(tmp_path):
    pair = ("Go.", "Geh jetzt sofort los.")  # ratio 7, shorter side only 3 characters
    paths = raw_corpus(tmp_path, train=[*GOOD_TRAIN[:3], pair])

    clean.run(parse({"clean": {"ratio_min_chars": 4}}), paths)
    assert pair in pairs_of(paths, "train")

    clean.run(parse({"clean": {"ratio_min_chars": 3}}), paths)
    assert pair not in pairs_of(paths, "train")
    assert [r["reason"] for r in rejected_rows(paths)] == ["length_ratio"]


def test_of_duplicate_pairs_the_first_is_kept_and_later_copies_are_rejected(tmp_path):
    dup = ("The cat  sleeps.", "Die Katze schläft.")
    train = [dup, *GOOD_TRAIN, ("The cat sleeps.", "Die Katze schläft."), dup]
    paths = raw_corpus(tmp_path, train=train)

    clean.run(parse({}), paths)

    kept = pairs_of(paths, "train")
    assert kept == [("The cat sleeps.", "Die Katze schläft."), *GOOD_TRAIN]
    lines = pq.read_table(paths.split_file(paths.clean, "train")).column("line").to_pylist()
    assert lines[0] == 1  # the first copy survives, at its own line
    assert [(r["line"], r["reason"]) for r in rejected_rows(paths)] == [(6, "duplicate"), (7, "duplicate")]


def test_deduplicate_false_keeps_duplicates(tmp_path):
    train = [*GOOD_TRAIN, GOOD_TRAIN[0], GOOD_TRAIN[0]]
    paths = raw_corpus(tmp_path, train=train)

    clean.run(parse({"clean": {"deduplicate": False}}), paths)

    assert pairs_of(paths, "train") == train
    assert rejected_rows(paths) == []


def test_a_pair_in_valid_also_counts_as_overlapping_eval(tmp_path):
    paths = raw_corpus(tmp_path, train=[*GOOD_TRAIN, VALID[1]])
    clean.run(parse({}), paths)
    assert [r["reason"] for r in rejected_rows(paths)] == ["overlaps_eval"]


def test_valid_and_test_splits_are_normalised_but_never_filtered(tmp_path):
    odd = [("", ""), ("Same", "Same"), ("A bird sings.", "Ein Vogel singt."), ("A bird sings.", "Ein Vogel singt.")]
    paths = raw_corpus(tmp_path, train=GOOD_TRAIN, valid=[*VALID, *odd], test=[*TEST, ("", "Leer"), *odd])

    clean.run(parse({}), paths)

    assert pairs_of(paths, "valid") == [*VALID, *odd]
    assert pairs_of(paths, "test") == [*TEST, ("", "Leer"), *odd]
    assert rejected_rows(paths) == []


# --- outputs and their bookkeeping ------------------------------------------------------------------------------


def test_rejected_rows_keep_split_origin_line_and_reason(tmp_path):
    paths = raw_corpus(tmp_path, train=[("", "leer"), *GOOD_TRAIN, ("Hi", "Hi")])
    clean.run(parse({}), paths)

    table = pq.read_table(paths.rejected)
    assert table.column_names == ["split", "src", "tgt", "origin", "line", "reason"]
    assert table.to_pylist() == [
        {"split": "train", "src": "", "tgt": "leer", "origin": "train.en", "line": 1, "reason": "empty"},
        {"split": "train", "src": "Hi", "tgt": "Hi", "origin": "train.en", "line": 6, "reason": "source_equals_target"},
    ]


def test_for_every_split_kept_plus_rejected_equals_input(tmp_path):
    train = [
        *GOOD_TRAIN,
        ("", "x"),
        GOOD_TRAIN[0],
        TEST[0],
        ("Same", "Same"),
        ("a " * 300, "Wort"),
        ("| 1 | 2 |", "| 1 | 2 | 3 |"),
        ("Hello there, my friend.", "Привет, мой друг."),
        ("A small house near the river.", "Una casa pequeña cerca del río."),
    ]
    paths = raw_corpus(tmp_path, train=train, valid=[*VALID, ("", "")])

    clean.run(parse({"clean": {"language_id": True, "min_script_share": 0.9}}), paths)

    metrics = clean_metrics(paths)
    rejected = pq.read_table(paths.rejected).column("split").to_pylist()
    inputs = {"train": len(train), "valid": len(VALID) + 1, "test": len(TEST)}
    for split, n_input in inputs.items():
        kept = pq.ParquetFile(paths.split_file(paths.clean, split)).metadata.num_rows
        assert kept + rejected.count(split) == n_input
        assert metrics["splits"][split]["input"] == n_input
        assert metrics["splits"][split]["kept"] == kept
        assert metrics["splits"][split]["rejected"] == rejected.count(split)
    assert metrics["splits"]["train"]["reasons"] == {
        "empty": 1,
        "too_long_words": 1,
        "source_equals_target": 1,
        "garbled": 1,
        "wrong_script": 1,
        "overlaps_eval": 1,
        "duplicate": 1,
        "wrong_language": 1,
    }
    assert (metrics["input"], metrics["kept"], metrics["rejected"]) == (
        sum(inputs.values()),
        sum(inputs.values()) - 8,
        8,
    )


def test_a_raw_parquet_without_the_expected_columns_names_the_file_and_missing_columns(tmp_path):
    paths = raw_corpus(tmp_path, train=GOOD_TRAIN)
    bad = paths.split_file(paths.raw, "valid")
    pq.write_table(pa.table({"source": ["It rains."], "target": ["Es regnet."], "line": [1]}), bad)

    with pytest.raises(InputFileError) as err:
        clean.run(parse({}), paths)

    message = str(err.value)
    assert str(bad) in message
    assert "'src'" in message and "'tgt'" in message and "'origin'" in message
    assert "'line'" not in message.split(";")[0]  # only the missing ones are listed as missing
    assert not paths.clean.exists()


def test_missing_raw_data_names_the_download_stage(tmp_path):
    with pytest.raises(MissingArtifact, match="'download'"):
        clean.run(parse({}), Paths(tmp_path))


# --- HTML and Moses punctuation ---------------------------------------------------------------------------------

HTML_TO_CLEAN = [
    ("Click <b>here</b> &amp; wait.", "Click here & wait."),
    ("line<br/>break and <p>paragraph</p>", "line break and paragraph"),
    ("&amp;quot;twice escaped&amp;quot; is common", '"twice escaped" is common'),
    ("&lt;i&gt;escaped tag&lt;/i&gt; too", "escaped tag too"),
    ("caf&eacute; &#233; &#xE9;", "café é é"),
    ("zero&#8203;width", "zerowidth"),
    ("<!-- a comment -->text", "text"),
    ("a < b and c > d", "a < b and c > d"),  # not a tag: a space follows '<'
]


@pytest.mark.parametrize(("messy", "expected"), HTML_TO_CLEAN)
def test_html_entities_are_unescaped_and_tags_removed(messy, expected):
    assert clean.normalize(pa.array([messy]), cfg=parse({}).clean).to_pylist() == [expected]


def test_strip_html_false_keeps_markup():
    cfg = parse({"clean": {"strip_html": False}}).clean
    assert clean.normalize(pa.array(["<b>bold</b> &amp;"]), cfg=cfg).to_pylist() == ["<b>bold</b> &amp;"]


def test_moses_punctuation_is_normalised_per_language():
    cfg = parse({}).clean
    de = clean.normalize(pa.array(["„Hallo“, sagte er… – und 1\u00a0000 Leute"]), lang="de", cfg=cfg).to_pylist()
    en = clean.normalize(pa.array(["He said “hello” – twice…"]), lang="en", cfg=cfg).to_pylist()
    assert de == ['"Hallo", sagte er... - und 1,000 Leute']
    assert en == ['He said "hello" - twice...']


def _fuzz(seed: int, n: int) -> list[str]:
    alphabet = [*"aBz 19 .,!?-[]#*+/=~|_@", *clean.MOSES_TRIGGER.strip("[]"), "  ", "nº", "ºC", "cm", "\u0663", "é"]
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(n)]


@pytest.mark.parametrize("lang", ["en", "de", "fr", "ru"])
def test_moses_step_gives_what_sacremoses_gives_string_by_string(lang):
    # The stage runs sacremoses' own rules as RE2 replacements, on the rows its pre-check selects; this checks
    # both against MosesPunctNormalizer.normalize on every string.
    from sacremoses import MosesPunctNormalizer

    texts = _fuzz(seed=len(lang), n=3000)
    reference = MosesPunctNormalizer(lang=lang)
    moses = clean.MosesPunct(lang)
    assert moses.vectorised
    expected = [" ".join(reference.normalize(t).split(" ")) for t in texts]
    got = [" ".join(t.split(" ")) for t in moses(pa.array(texts)).to_pylist()]
    collapse = [" ".join(filter(None, t.split(" "))) for t in expected]
    assert [" ".join(filter(None, t.split(" "))) for t in got] == collapse


def test_moses_falls_back_to_string_by_string_when_a_rule_does_not_translate():
    moses = clean.MosesPunct("en")
    assert moses.check()
    moses.rules.append(("(?<=a)b", "c"))  # a look-behind, as a future sacremoses rule might have: not RE2
    moses.vectorised = moses.check()
    assert not moses.vectorised
    assert moses(pa.array(["“x” …", "plain"])).to_pylist() == ['"x" ...', "plain"]


# --- deduplication in bounded memory -----------------------------------------------------------------------------


def test_hash_set_matches_a_python_set_and_costs_8_bytes_a_member():
    rng = np.random.default_rng(0)
    members: set[int] = set()
    hashes = HashSet64()
    for _ in range(40):
        batch = np.unique(rng.integers(0, 2**63, size=int(rng.integers(1, 500)), dtype=np.uint64))
        probe = np.concatenate([batch, np.array(list(members)[:50], dtype=np.uint64)])
        assert hashes.contains(probe).tolist() == [int(h) in members for h in probe]
        new = batch[~hashes.contains(batch)]
        hashes.add(new)
        members.update(int(h) for h in new)
    assert len(hashes) == len(members) and hashes.nbytes == 8 * len(members)
    assert len(hashes.runs) <= 2 * np.log2(len(members))  # merged into few runs


def test_duplicates_are_found_across_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "BATCH_ROWS", 3)  # many small batches instead of one
    train = [*GOOD_TRAIN, GOOD_TRAIN[0], *GOOD_TRAIN[1:3], GOOD_TRAIN[3]]
    paths = raw_corpus(tmp_path, train=train)

    clean.run(parse({}), paths)

    assert pairs_of(paths, "train") == GOOD_TRAIN
    assert [r["line"] for r in rejected_rows(paths)] == [5, 6, 7, 8]
