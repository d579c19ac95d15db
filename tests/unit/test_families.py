"""Checkpoint families and language codes (pipeline/families.py), the recorded layouts (pipeline/sequence_layout.py)
and the params check of a local checkpoint (stages/check_params.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.families import (
    FAMILIES,
    MissingLanguageCode,
    UnsupportedCheckpoint,
    check_local_checkpoint,
    family_of,
    language_codes,
)
from pipeline.languages import Directions
from pipeline.sequence_layout import DirectionLayout, ModelLanguages, split_framing
from stages.check_params import check_checkpoint

FAMILY = {f.name: f for f in FAMILIES}
MBART50_CODES = ["ar_AR", "cs_CZ", "de_DE", "en_XX", "fr_XX", "zh_CN"]
NLLB_CODES = ["ces_Latn", "deu_Latn", "eng_Latn", "fra_Latn", "zho_Hans", "zho_Hant", "arb_Arab"]


@pytest.mark.parametrize(("family", "vocabulary", "expected"), [
    ("mbart50", MBART50_CODES + ["▁de", "en"], {"en": "en_XX", "de": "de_DE", "fr": "fr_XX", "cs": "cs_CZ"}),
    ("m2m100", ["__en__", "__de__", "__fr__", "__cs__", "▁a"], {"en": "__en__", "de": "__de__", "fr": "__fr__",
                                                                "cs": "__cs__"}),
    ("nllb", NLLB_CODES, {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn", "cs": "ces_Latn"}),
    ("marian", [">>deu<<", ">>fra<<", ">>ces<<", ">>en<<", "▁x"], {"en": ">>en<<", "de": ">>deu<<", "fr": ">>fra<<",
                                                                  "cs": ">>ces<<"}),
])
def test_every_family_maps_iso_codes_to_its_own(family, vocabulary, expected):
    assert language_codes(FAMILY[family], expected, vocabulary, {}, "ckpt") == expected


def test_nllb_takes_the_member_language_and_script_it_was_trained_on():
    assert language_codes(FAMILY["nllb"], ["zh", "ar"], NLLB_CODES, {}, "ckpt") == {"zh": "zho_Hans",
                                                                                    "ar": "arb_Arab"}
    # ... and an override picks another of its codes.
    assert language_codes(FAMILY["nllb"], ["zh"], NLLB_CODES, {"zh": "zho_Hant"}, "ckpt") == {"zh": "zho_Hant"}


def test_a_missing_code_lists_the_codes_the_tokenizer_has():
    with pytest.raises(MissingLanguageCode) as err:
        language_codes(FAMILY["mbart50"], ["en", "is"], MBART50_CODES, {}, "ckpt/dir")
    message = str(err.value)
    assert "ckpt/dir" in message and "'is'" in message
    assert "ar_AR, cs_CZ, de_DE, en_XX, fr_XX, zh_CN" in message and "model.language_codes" in message


def test_an_override_outside_the_tokenizers_codes_is_refused_naming_the_param():
    with pytest.raises(MissingLanguageCode, match=r"model.language_codes.de='de_AT'"):
        language_codes(FAMILY["mbart50"], ["de"], MBART50_CODES, {"de": "de_AT"}, "ckpt")


@pytest.mark.parametrize(("model_type", "tokenizer", "family"), [
    ("marian", "MarianTokenizer", "marian"), ("mbart", "MBartTokenizer", "mbart"),
    ("mbart", "MBart50Tokenizer", "mbart50"), ("m2m_100", "M2M100Tokenizer", "m2m100"),
    ("m2m_100", "NllbTokenizer", "nllb"),
])
def test_the_tokenizer_class_tells_the_family(model_type, tokenizer, family):
    assert family_of(model_type, tokenizer, "ckpt").name == family


def test_without_a_tokenizer_class_the_family_is_the_one_autotokenizer_picks():
    # Older OPUS-MT repositories (Helsinki-NLP/opus-mt-en-de) name no tokenizer_class.
    assert family_of("marian", None, "ckpt").name == "marian"
    assert family_of("m2m_100", None, "ckpt").name == "m2m100"
    with pytest.raises(UnsupportedCheckpoint):
        family_of("t5", None, "ckpt")


@pytest.mark.parametrize(("model_type", "tokenizer"), [("t5", "T5Tokenizer"), ("bart", "BartTokenizer"),
                                                      ("marian", "MBart50Tokenizer")])
def test_an_unsupported_architecture_names_the_supported_families(model_type, tokenizer):
    with pytest.raises(UnsupportedCheckpoint) as err:
        family_of(model_type, tokenizer, "some/ckpt")
    message = str(err.value)
    assert "some/ckpt" in message and model_type in message
    assert all(f.name in message for f in FAMILIES)


def _checkpoint(directory: Path, model_type: str, tokenizer: str) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer}))
    return directory


def test_params_check_reads_a_local_checkpoints_family_without_loading_it(tmp_path):
    assert check_local_checkpoint(_checkpoint(tmp_path / "ok", "mbart", "MBart50Tokenizer")).name == "mbart50"
    check_checkpoint(str(tmp_path / "ok"))
    with pytest.raises(UnsupportedCheckpoint, match="t5"):
        check_checkpoint(str(_checkpoint(tmp_path / "t5", "t5", "T5Tokenizer")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnsupportedCheckpoint, match="no config.json"):
        check_checkpoint(str(tmp_path / "empty"))


def test_params_check_refuses_a_missing_directory_but_lets_hub_names_through(tmp_path):
    with pytest.raises(PipelineError, match="model.name_or_path .*no such directory"):
        check_checkpoint(str(tmp_path / "models" / "final"))
    check_checkpoint("facebook/mbart-large-50")  # tokenize loads it (or says the hub is unreachable)


def test_split_framing_finds_the_special_ids_around_the_pieces():
    assert split_framing([250004, 7, 8, 9, 2], [7, 8, 9]) == ((250004,), (2,))
    assert split_framing([7, 8, 2, 250004], [7, 8]) == ((), (2, 250004))
    with pytest.raises(ValueError):
        split_framing([7, 2, 8], [7, 8])


def test_languages_file_round_trips_with_layouts(tmp_path):
    directions = Directions.of(["en-de", "en-fr"])
    layouts = {"en-de": DirectionLayout((10,), (2,), (11,), (2,), 2),
               "en-fr": DirectionLayout((10,), (2,), (12,), (2,), 2)}
    written = ModelLanguages(directions, "mbart50", {"en": "en_XX", "de": "de_DE", "fr": "fr_XX"}, layouts)
    written.write(tmp_path)
    read = ModelLanguages.read(tmp_path)
    assert read == written
    assert read.layout("en-fr").decoder_prefix == (2, 12)
    assert read.layout("en-de").source([5, 6]) == [10, 5, 6, 2]
    assert Directions.read(tmp_path) == directions  # the directions' readers see the same file


def test_a_languages_file_without_layouts_says_so(tmp_path):
    Directions.of(["en-de"]).write(tmp_path)
    with pytest.raises(ValueError, match="no layout"):
        ModelLanguages.read(tmp_path)
