"""The model's one record of its languages (pipeline/runtime/model_languages.py): languages.json round-trips with its
layouts, and its one reader refuses a file that is missing, malformed, or of another family than the checkpoint
beside it, naming the file."""

from __future__ import annotations

import json

import pytest

from pipeline.runtime.families import UnsupportedCheckpoint
from pipeline.runtime.languages import Directions
from pipeline.runtime.model_languages import (
    DirectionLayout,
    LanguagesFileError,
    ModelLanguages,
    family_named,
    split_framing,
)
from tests.conftest import write_marian_languages


def test_split_framing_finds_the_special_ids_around_the_pieces():
    assert split_framing([250004, 7, 8, 9, 2], [7, 8, 9]) == ((250004,), (2,))
    assert split_framing([7, 8, 2, 250004], [7, 8]) == ((), (2, 250004))
    with pytest.raises(ValueError):
        split_framing([7, 2, 8], [7, 8])


def test_languages_file_round_trips_with_layouts(tmp_path):
    directions = Directions.of(["en-de", "en-fr"])
    layouts = {"en-de": DirectionLayout((10,), (2,), (11,), (2,), 2),
               "en-fr": DirectionLayout((10,), (2,), (12,), (2,), 2)}
    codes = {"en": "en_XX", "de": "de_DE", "fr": "fr_XX"}
    written = ModelLanguages(directions, family_named("mbart50"), codes, layouts)
    written.write(tmp_path)
    read = ModelLanguages.read(tmp_path)
    assert read == written
    assert read.layout("en-fr").decoder_prefix == (2, 12)
    assert read.layout("en-de").source([5, 6]) == [10, 5, 6, 2]


def test_a_languages_file_without_layouts_says_so(tmp_path):
    (tmp_path / "languages.json").write_text('{"directions": ["en-de"], "family": "marian"}')
    with pytest.raises(LanguagesFileError, match=r"languages\.json: not a languages record with every direction's "
                                                 r"layout"):
        ModelLanguages.read(tmp_path)


@pytest.mark.parametrize(("directions", "problem"), [
    (["en_de"], "'en_de' is not a direction"),
    ([], "it lists no directions"),
    (["en-de", "en-de"], "en-de is listed twice"),
])
def test_directions_that_are_no_directions_are_refused_naming_the_file(tmp_path, directions, problem):
    write_marian_languages(tmp_path, ["en-de"])
    recorded = json.loads((tmp_path / "languages.json").read_text())
    (tmp_path / "languages.json").write_text(json.dumps({**recorded, "directions": directions}))
    with pytest.raises(LanguagesFileError, match=rf"{tmp_path}/languages\.json: .*{problem}"):
        ModelLanguages.read(tmp_path)


def test_an_unknown_family_is_refused_naming_the_families(tmp_path):
    write_marian_languages(tmp_path, ["en-de"])
    recorded = json.loads((tmp_path / "languages.json").read_text())
    (tmp_path / "languages.json").write_text(json.dumps({**recorded, "family": "t5"}))
    with pytest.raises(LanguagesFileError, match=r"family 't5' is not one of marian, mbart, mbart50, m2m100, nllb"):
        ModelLanguages.read(tmp_path)


def test_a_missing_or_unreadable_file_is_named_with_what_writes_it(tmp_path):
    with pytest.raises(LanguagesFileError, match=r"languages\.json: not found .*rerun the pipeline from tokenize"):
        ModelLanguages.read(tmp_path)
    (tmp_path / "languages.json").write_bytes(b"\xff{")
    with pytest.raises(LanguagesFileError, match=r"languages\.json: not JSON"):
        ModelLanguages.read(tmp_path)


def test_the_family_is_checked_against_the_checkpoint_beside_the_file(tmp_path):
    write_marian_languages(tmp_path, ["en-de"])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "marian"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer"}))
    assert ModelLanguages.read(tmp_path).family.name == "marian"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MBart50Tokenizer"}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mbart"}))
    with pytest.raises(LanguagesFileError, match=r"family 'marian', but the checkpoint beside it is a mbart50 one"):
        ModelLanguages.read(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    with pytest.raises(UnsupportedCheckpoint, match=r"tokenizer 'T5Tokenizer' is not a supported family"):
        ModelLanguages.read(tmp_path)


def test_only_a_marian_model_s_sources_carry_target_tags():
    tagged = DirectionLayout((5,), (0,), (), (0,), 9)
    coded = DirectionLayout((10,), (2,), (11,), (2,), 2)
    two = Directions.of(["en-de", "en-fr"])
    assert ModelLanguages(two, family_named("marian"), {}, {"en-de": tagged, "en-fr": tagged}).target_tags
    assert not ModelLanguages(two, family_named("mbart50"), {}, {"en-de": coded, "en-fr": coded}).target_tags
    untagged = DirectionLayout((), (0,), (), (0,), 9)
    assert not ModelLanguages(Directions.of(["en-de"]), family_named("marian"), {}, {"en-de": untagged}).target_tags
