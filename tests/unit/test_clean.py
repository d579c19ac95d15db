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
from pipeline.errors import MissingArtifact
from pipeline.params import parse
from pipeline.runtime.errors import InputFileError, PipelineError
from pipeline.text_checks import HashSet64
from stages import clean
from stages.clean.filters import REASONS
from stages.clean.moses import MOSES_TRIGGER, MosesPunct
from stages.clean.normalization import normalize
from tests.conftest import write_pair_parquet

GOOD_TRAIN = [
    ("A dog runs in the park.", "Ein Hund rennt im Park."),
    ("Two children play football.", "Zwei Kinder spielen Fußball."),
    ("The woman reads a book.", "Die Frau liest ein Buch."),
    ("No way.", "Auf keinen Fall, nein."),  # ratio 3.14, but the shorter side is under ratio_min_chars: kept
]
VALID = [("It rains.", "Es regnet."), ("The bus is late.", "Der Bus ist spät.")]
TEST = [("A bird sings.", "Ein Vogel singt."), ("Snow falls.", "Schnee fällt.")]


def write_raw(root: Path, split: str, pairs: list[tuple[str, str]], direction: str = "en-de") -> Path:
    return write_pair_parquet(root / "data" / "raw" / f"{split}.parquet", pairs, f"{split}.en", direction)


def raw_corpus(root: Path, train: list, valid: list = VALID, test: list = TEST, direction: str = "en-de") -> Paths:
    write_raw(root, "train", train, direction)
    write_raw(root, "valid", valid, direction)
    write_raw(root, "test", test, direction)
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
    paths = raw_corpus(tmp_path, train=[good, bad], valid=VALID, test=TEST, direction="en-ru")
    clean.run(directions_params(["en-ru"]), paths)
    assert pairs_of(paths, "train") == [good]
    assert [r["reason"] for r in rejected_rows(paths)] == ["wrong_script"]


def test_every_reject_reason_the_stage_knows_is_covered_here():
    assert set(REJECTS) == set(REASONS)


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


def test_rejected_rows_keep_split_languages_origin_line_and_reason(tmp_path):
    paths = raw_corpus(tmp_path, train=[("", "leer"), *GOOD_TRAIN, ("Hi", "Hi")])
    clean.run(parse({}), paths)

    table = pq.read_table(paths.rejected)
    assert table.column_names == ["split", "src", "tgt", "src_lang", "tgt_lang", "origin", "line", "reason"]
    languages = {"src_lang": "en", "tgt_lang": "de"}
    assert table.to_pylist() == [
        {"split": "train", "src": "", "tgt": "leer", **languages, "origin": "train.en", "line": 1, "reason": "empty"},
        {"split": "train", "src": "Hi", "tgt": "Hi", **languages, "origin": "train.en", "line": 6,
         "reason": "source_equals_target"},
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
    assert normalize(pa.array([messy]), cfg=parse({}).clean).to_pylist() == [expected]


def test_strip_html_false_keeps_markup():
    cfg = parse({"clean": {"strip_html": False}}).clean
    assert normalize(pa.array(["<b>bold</b> &amp;"]), cfg=cfg).to_pylist() == ["<b>bold</b> &amp;"]


def test_moses_punctuation_is_normalised_per_language():
    cfg = parse({}).clean
    de = normalize(pa.array(["„Hallo“, sagte er… – und 1\u00a0000 Leute"]), lang="de", cfg=cfg).to_pylist()
    en = normalize(pa.array(["He said “hello” – twice…"]), lang="en", cfg=cfg).to_pylist()
    assert de == ['"Hallo", sagte er... - und 1,000 Leute']
    assert en == ['He said "hello" - twice...']


def _fuzz(seed: int, n: int) -> list[str]:
    alphabet = [*"aBz 19 .,!?-[]#*+/=~|_@", *MOSES_TRIGGER.strip("[]"), "  ", "nº", "ºC", "cm", "\u0663", "é"]
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(n)]


@pytest.mark.parametrize("lang", ["en", "de", "fr", "ru"])
def test_moses_step_gives_what_sacremoses_gives_string_by_string(lang):
    # The stage runs sacremoses' own rules as RE2 replacements, on the rows its pre-check selects; this checks
    # both against MosesPunctNormalizer.normalize on every string.
    from sacremoses import MosesPunctNormalizer

    texts = _fuzz(seed=len(lang), n=3000)
    reference = MosesPunctNormalizer(lang=lang)
    moses = MosesPunct(lang)
    assert moses.vectorised
    expected = [" ".join(reference.normalize(t).split(" ")) for t in texts]
    got = [" ".join(t.split(" ")) for t in moses(pa.array(texts)).to_pylist()]
    collapse = [" ".join(filter(None, t.split(" "))) for t in expected]
    assert [" ".join(filter(None, t.split(" "))) for t in got] == collapse


def test_moses_falls_back_to_string_by_string_when_a_rule_does_not_translate():
    moses = MosesPunct("en")
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


# --- several directions in one file ------------------------------------------------------------------------------

TEST_SPLITS = ("train", "valid", "test")


def directions_params(directions: list[str], clean_overrides: dict | None = None):
    """Params for `directions` (files named per language: clean reads data/raw only, never these)."""
    files = {split: {"pattern": f"corpus/{split}.{{lang}}"} for split in TEST_SPLITS}
    data = {"source": "files", "directions": directions, "files": files}
    return parse({"data": data, "clean": clean_overrides or {}})


def write_mixed(root: Path, split: str, rows: dict[str, list[tuple[str, str]]]) -> Path:
    """data/raw/<split>.parquet holding the pairs of several directions, interleaved row by row (so every batch
    mixes them); lines are numbered per direction, as download numbers the lines of each direction's file."""
    columns: dict[str, list] = {name: [] for name in corpus.PAIR_SCHEMA.names}
    queues = {d: list(enumerate(pairs, start=1)) for d, pairs in rows.items()}
    while any(queues.values()):
        for direction, queue in queues.items():
            if not queue:
                continue
            line, (src, tgt) = queue.pop(0)
            src_lang, tgt_lang = direction.split("-")
            values = (src, tgt, src_lang, tgt_lang, f"{split}.{direction}", line)
            for name, value in zip(corpus.PAIR_SCHEMA.names, values, strict=True):
                columns[name].append(value)
    path = root / "data" / "raw" / f"{split}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns, schema=corpus.PAIR_SCHEMA), path)
    return path


def kept_by_direction(paths: Paths, split: str) -> dict[str, list[tuple[str, str]]]:
    kept: dict[str, list[tuple[str, str]]] = {}
    for row in pq.read_table(paths.split_file(paths.clean, split)).to_pylist():
        kept.setdefault(f"{row['src_lang']}-{row['tgt_lang']}", []).append((row["src"], row["tgt"]))
    return kept


FR_TRAIN = [
    ("A dog runs in the park.", "Un chien court dans le parc."),
    ("The pupil writes next to the window.", "L'élève écrit à côté de la fenêtre."),
    ("The girl eats an apple at noon.", "La fille mange une pomme à midi."),
]
CS_TRAIN = [
    ("A dog runs in the park.", "Pes běží v parku."),
    ("Three girls are dancing on the stage.", "Tři dívky tančí na pódiu."),
    ("The man drinks coffee every morning.", "Muž pije kávu každé ráno."),
]
FR_VALID = [("It rains.", "Il pleut."), ("The bus is late.", "Le bus est en retard.")]
CS_VALID = [("It rains.", "Prší."), ("The bus is late.", "Autobus má zpoždění.")]
THREE = ["en-de", "en-fr", "en-cs"]


def three_direction_corpus(root: Path, train: dict[str, list], valid: dict[str, list] | None = None) -> Paths:
    write_mixed(root, "train", train)
    write_mixed(root, "valid", valid or {"en-de": VALID, "en-fr": FR_VALID, "en-cs": CS_VALID})
    write_mixed(root, "test", {"en-de": TEST, "en-fr": [("A bird sings.", "Un oiseau chante.")]})
    return Paths(root)


def test_czech_and_french_diacritics_pass_and_cyrillic_in_a_czech_row_is_wrong_script(tmp_path):
    cyrillic = ("The cat sleeps on the sofa.", "Кошка спит на диване.")
    paths = three_direction_corpus(tmp_path, {"en-de": GOOD_TRAIN, "en-fr": FR_TRAIN, "en-cs": [*CS_TRAIN, cyrillic]})

    clean.run(directions_params(THREE), paths)

    assert kept_by_direction(paths, "train") == {"en-de": GOOD_TRAIN, "en-fr": FR_TRAIN, "en-cs": CS_TRAIN}
    assert [(r["src_lang"], r["tgt_lang"], r["line"], r["reason"], r["origin"]) for r in rejected_rows(paths)] == [
        ("en", "cs", len(CS_TRAIN) + 1, "wrong_script", "train.en-cs")
    ]


def test_cyrillic_in_a_german_row_is_wrong_script_where_a_russian_row_passes(tmp_path):
    russian = ("The cat sleeps on the sofa.", "Кошка спит на диване.")
    train = {"en-de": [*GOOD_TRAIN, russian], "en-ru": [russian, ("The dog barks loudly.", "Собака громко лает.")]}
    valid = {"en-de": VALID, "en-ru": [("It rains.", "Идёт дождь.")]}
    write_mixed(tmp_path, "train", train)
    write_mixed(tmp_path, "valid", valid)
    write_mixed(tmp_path, "test", {"en-de": TEST})
    paths = Paths(tmp_path)

    clean.run(directions_params(["en-de", "en-ru"]), paths)

    assert kept_by_direction(paths, "train") == {"en-de": GOOD_TRAIN, "en-ru": train["en-ru"]}
    assert [(r["tgt_lang"], r["reason"]) for r in rejected_rows(paths)] == [("de", "wrong_script")]


def test_devanagari_passes_in_a_hindi_row_and_latin_there_is_wrong_script(tmp_path):
    hindi = [("The children are playing.", "बच्चे खेल रहे हैं।"), ("I drink tea.", "मैं चाय पीता हूँ।")]
    latin = ("The children are playing.", "Die Kinder spielen.")
    devanagari_in_german = ("I drink tea.", "मैं चाय पीता हूँ।")
    write_mixed(tmp_path, "train", {"en-de": [*GOOD_TRAIN, devanagari_in_german], "en-hi": [*hindi, latin]})
    write_mixed(tmp_path, "valid", {"en-de": VALID, "en-hi": [("It rains.", "बारिश हो रही है।")]})
    write_mixed(tmp_path, "test", {"en-hi": [("A bird sings.", "एक चिड़िया गाती है।")]})
    paths = Paths(tmp_path)

    clean.run(directions_params(["en-de", "en-hi"]), paths)

    assert kept_by_direction(paths, "train") == {"en-de": GOOD_TRAIN, "en-hi": hindi}
    assert {(r["tgt_lang"], r["tgt"], r["reason"]) for r in rejected_rows(paths)} == {
        ("de", devanagari_in_german[1], "wrong_script"),
        ("hi", latin[1], "wrong_script"),
    }


def test_an_eval_pair_overlaps_only_training_pairs_of_its_own_direction(tmp_path):
    # The en-fr valid pair is rejected from en-fr training, but the same texts in an en-cs row are no contamination
    # of en-cs (whose valid/test sets do not hold them); likewise the en-de valid pair in an en-fr row.
    train = {"en-de": GOOD_TRAIN, "en-fr": [*FR_TRAIN, FR_VALID[1], VALID[1]], "en-cs": [*CS_TRAIN, FR_VALID[1]]}
    paths = three_direction_corpus(tmp_path, train)

    clean.run(directions_params(THREE), paths)

    assert [(r["tgt_lang"], r["src"], r["reason"]) for r in rejected_rows(paths)] == [
        ("fr", FR_VALID[1][0], "overlaps_eval")
    ]
    kept = kept_by_direction(paths, "train")
    assert kept["en-fr"] == [*FR_TRAIN, VALID[1]]
    assert kept["en-cs"] == [*CS_TRAIN, FR_VALID[1]]


def test_the_same_pair_in_two_directions_is_not_a_duplicate_but_twice_in_one_is(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "BATCH_ROWS", 2)  # copies fall in other batches than their first occurrence
    shared = ("Hotel Berlin, room twelve, second floor.", "Hotel Berlin, chambre douze, deuxième étage.")
    train = {"en-de": [*GOOD_TRAIN, shared], "en-fr": [shared, *FR_TRAIN, shared], "en-cs": [*CS_TRAIN, shared]}
    paths = three_direction_corpus(tmp_path, train)

    clean.run(directions_params(THREE), paths)

    kept = kept_by_direction(paths, "train")
    assert kept == {"en-de": [*GOOD_TRAIN, shared], "en-fr": [shared, *FR_TRAIN], "en-cs": [*CS_TRAIN, shared]}
    assert [(r["tgt_lang"], r["line"], r["reason"]) for r in rejected_rows(paths)] == [("fr", 5, "duplicate")]


def test_metrics_count_every_direction_of_every_split_and_kept_plus_rejected_is_its_input(tmp_path):
    train = {
        "en-de": [*GOOD_TRAIN, ("", "leer"), GOOD_TRAIN[0]],
        "en-fr": [*FR_TRAIN, FR_VALID[0]],
        "en-cs": [*CS_TRAIN, ("The cat sleeps on the sofa.", "Кошка спит на диване."), ("Same", "Same")],
    }
    paths = three_direction_corpus(tmp_path, train)

    clean.run(directions_params(THREE), paths)

    metrics = clean_metrics(paths)
    assert list(metrics["directions"]) == THREE
    assert metrics["directions"]["en-de"]["train"] == {"input": 6, "kept": 4, "rejected": 2}
    assert metrics["directions"]["en-de"]["reasons"] == {"empty": 1, "duplicate": 1}
    assert metrics["directions"]["en-fr"]["reasons"] == {"overlaps_eval": 1}
    assert metrics["directions"]["en-cs"]["reasons"] == {"source_equals_target": 1, "wrong_script": 1}
    assert metrics["directions"]["en-cs"]["test"] == {"input": 0, "kept": 0, "rejected": 0}  # no en-cs test set
    rejected = pq.read_table(paths.rejected).to_pylist()
    for direction, figures in metrics["directions"].items():
        src_lang, tgt_lang = direction.split("-")
        for split in TEST_SPLITS:
            table = pq.read_table(paths.split_file(paths.raw, split)).to_pylist()
            n_input = sum((r["src_lang"], r["tgt_lang"]) == (src_lang, tgt_lang) for r in table)
            n_kept = len(kept_by_direction(paths, split).get(direction, []))
            n_rejected = sum(r["split"] == split and r["tgt_lang"] == tgt_lang for r in rejected)
            assert figures[split] == {"input": n_input, "kept": n_kept, "rejected": n_rejected}
            assert n_kept + n_rejected == n_input
    for split in TEST_SPLITS:  # the totals stay what one direction had, summed over the directions
        per_direction = [metrics["directions"][d][split] for d in THREE]
        assert metrics["splits"][split]["input"] == sum(f["input"] for f in per_direction)
        assert metrics["splits"][split]["kept"] == sum(f["kept"] for f in per_direction)
    assert (metrics["input"], metrics["rejected"]) == (sum(metrics["splits"][s]["input"] for s in TEST_SPLITS), 5)


def test_one_direction_also_gets_its_figures_under_directions(tmp_path):
    paths = raw_corpus(tmp_path, train=[*GOOD_TRAIN, ("", "leer")])
    clean.run(parse({}), paths)
    metrics = clean_metrics(paths)
    assert metrics["directions"] == {
        "en-de": {
            "train": {"input": 5, "kept": 4, "rejected": 1},
            "valid": {"input": 2, "kept": 2, "rejected": 0},
            "test": {"input": 2, "kept": 2, "rejected": 0},
            "reasons": {"empty": 1},
        }
    }
    assert metrics["splits"]["train"] == {"input": 5, "kept": 4, "rejected": 1, "reasons": {"empty": 1}}


def test_language_id_judges_each_row_against_its_own_language(tmp_path):
    german = "Die Kinder spielen am Nachmittag im großen Garten hinter dem Haus."
    french = "Les enfants jouent l'après-midi dans le grand jardin derrière la maison."
    czech = "Děti si odpoledne hrají na velké zahradě za domem."
    source = "The children play in the big garden behind the house in the afternoon."
    train = {
        "en-de": [*GOOD_TRAIN, (source, german), (source + " Really.", french)],
        "en-fr": [*FR_TRAIN, (source, french), (source + " Really.", german)],
        "en-cs": [*CS_TRAIN, (source, czech), (source + " Really.", french)],
    }
    paths = three_direction_corpus(tmp_path, train)

    clean.run(directions_params(THREE, {"language_id": True}), paths)

    assert {(r["tgt_lang"], r["tgt"], r["reason"]) for r in rejected_rows(paths)} == {
        ("de", french, "wrong_language"),
        ("fr", german, "wrong_language"),
        ("cs", french, "wrong_language"),
    }
    kept = kept_by_direction(paths, "train")
    assert (source, german) in kept["en-de"] and (source, french) in kept["en-fr"] and (source, czech) in kept["en-cs"]


def test_language_id_candidates_include_every_language_of_the_directions(tmp_path):
    # "cs" is not among the configured candidates: the row's own language is added, so Czech is still recognised.
    czech = "Děti si odpoledne hrají na velké zahradě za domem."
    train = {"en-de": GOOD_TRAIN, "en-fr": FR_TRAIN, "en-cs": [*CS_TRAIN, ("The children play in the garden.", czech)]}
    paths = three_direction_corpus(tmp_path, train)

    clean.run(directions_params(THREE, {"language_id": True, "language_id_candidates": ["en", "es"]}), paths)

    assert ("The children play in the garden.", czech) in kept_by_direction(paths, "train")["en-cs"]
    assert rejected_rows(paths) == []


def test_punctuation_is_normalised_with_each_rows_own_language(tmp_path, monkeypatch):
    # sacremoses moves a comma inside closing quotes for English only: the same texts in an en-de and a de-en row
    # come out each side by its own language, in the same batch.
    english, german = 'He said "yes", then he left the room.', 'Er sagte "ja", dann verließ er den Raum.'
    train = {
        "en-de": [*GOOD_TRAIN, (english, german)],
        "de-en": [(german, english), ("Es regnet oft.", "It often rains.")],
    }
    write_mixed(tmp_path, "train", train)
    write_mixed(tmp_path, "valid", {"en-de": VALID, "de-en": [("Es schneit.", "It snows.")]})
    write_mixed(tmp_path, "test", {"en-de": TEST})
    paths = Paths(tmp_path)

    clean.run(parse({"data": {"directions": ["en-de", "de-en"]}}), paths)

    english_normalised = 'He said "yes," then he left the room.'
    kept = kept_by_direction(paths, "train")
    assert kept["en-de"][-1] == (english_normalised, german)
    assert kept["de-en"][0] == (german, english_normalised)


def test_a_row_of_a_direction_params_do_not_list_names_the_file_and_direction(tmp_path):
    paths = three_direction_corpus(tmp_path, {"en-de": GOOD_TRAIN, "en-fr": FR_TRAIN, "en-cs": CS_TRAIN})
    # valid is cleaned first (training pairs are checked against it), so it is the file named.
    with pytest.raises(InputFileError, match=r"valid\.parquet: rows of direction\(s\) en-cs, which data\.directions "
                                             r"\(en-de, en-fr\) does not list"):
        clean.run(directions_params(["en-de", "en-fr"]), paths)
    assert not paths.clean.exists()


def test_a_row_without_languages_names_the_file_and_line(tmp_path):
    paths = raw_corpus(tmp_path, train=GOOD_TRAIN)
    table = pq.read_table(paths.split_file(paths.raw, "valid"))
    langs = pa.array(["en", None], pa.string())
    pq.write_table(table.set_column(table.schema.get_field_index("src_lang"), "src_lang", langs),
                   paths.split_file(paths.raw, "valid"))
    with pytest.raises(InputFileError, match=r"valid\.parquet, line 2: a row without src_lang/tgt_lang"):
        clean.run(parse({}), paths)


def test_a_direction_whose_training_pairs_are_all_rejected_stops_the_stage_naming_it(tmp_path):
    bad = [("The cat sleeps on the sofa.", "Кошка спит на диване."), ("Same", "Same")]
    paths = three_direction_corpus(tmp_path, {"en-de": GOOD_TRAIN, "en-fr": FR_TRAIN, "en-cs": bad})
    with pytest.raises(PipelineError, match=r"no training pairs of direction en-cs \(2 in .*train\.parquet\); "
                                            r"rejected: \{'source_equals_target': 1, 'wrong_script': 1\}"):
        clean.run(directions_params(THREE), paths)


def test_a_direction_without_valid_pairs_stops_the_stage_naming_it(tmp_path):
    train = {"en-de": GOOD_TRAIN, "en-fr": FR_TRAIN, "en-cs": CS_TRAIN}
    paths = three_direction_corpus(tmp_path, train, valid={"en-de": VALID, "en-fr": FR_VALID})
    with pytest.raises(PipelineError, match=r"valid\.parquet has no pairs of direction en-cs"):
        clean.run(directions_params(THREE), paths)
