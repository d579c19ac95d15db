"""Checkpoint families and language codes (pipeline/runtime/families.py), the recorded layouts
(pipeline/runtime/model_languages.py) and the params check of a local checkpoint (stages/check_params)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import (
    FAMILIES,
    DirectionNotTranslated,
    MissingLanguageCode,
    UnsupportedCheckpoint,
    check_checkpoint_languages,
    check_local_checkpoint,
    checkpoint_codes,
    checkpoint_tokens,
    declared_languages,
    family_of,
    language_codes,
    languages_named,
)
from pipeline.runtime.languages import Directions
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


EN_DE = Directions.of(["en-de"])


def test_params_check_reads_a_local_checkpoints_family_without_loading_it(tmp_path):
    assert check_local_checkpoint(_checkpoint(tmp_path / "ok", "mbart", "MBart50Tokenizer")).name == "mbart50"
    check_checkpoint(str(tmp_path / "ok"), EN_DE, {})
    with pytest.raises(UnsupportedCheckpoint, match="t5"):
        check_checkpoint(str(_checkpoint(tmp_path / "t5", "t5", "T5Tokenizer")), EN_DE, {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnsupportedCheckpoint, match="no config.json"):
        check_checkpoint(str(tmp_path / "empty"), EN_DE, {})


def test_params_check_refuses_a_missing_directory_but_lets_hub_names_through(tmp_path):
    with pytest.raises(PipelineError, match="model.name_or_path .*no such directory"):
        check_checkpoint(str(tmp_path / "models" / "final"), EN_DE, {})
    check_checkpoint("facebook/mbart-large-50", EN_DE, {})  # tokenize loads it (or says the hub is unreachable)


@pytest.mark.parametrize(("declared", "languages"), [
    ("de", {"de"}), ("deu", {"de"}), ("fr+fr_BE+es", {"fr", "es"}), ("en,de", {"en", "de"}),
    # Groups, the ISO 639-5 "multiple languages" and codes outside the built-in map tell nothing: not checked.
    ("ROMANCE", None), ("mul", None), ("ZH", None), ("fr+ROMANCE", None), ("cmn", None), (None, None), ("", None),
])
def test_a_declared_source_or_target_names_the_languages_it_can_be_told_to_be(declared, languages):
    assert languages_named(declared) == languages


def test_checkpoint_codes_refuses_a_direction_outside_a_single_target_checkpoint_s_declared_languages():
    marian, de_en = FAMILY["marian"], Directions.of(["de-en"])
    with pytest.raises(DirectionNotTranslated, match=r"ckpt translates en-de \(its tokenizer_config.json: "
                                                     r"source_lang 'en', target_lang 'de'\), not de-en"):
        checkpoint_codes(marian, ["</s>", "▁a"], de_en, {}, "ckpt", ("en", "de"))
    assert checkpoint_codes(marian, ["</s>", "▁a"], de_en, {}, "ckpt", ("de", "en")) == {}
    assert checkpoint_codes(marian, ["</s>", "▁a"], de_en, {}, "ckpt") == {}  # nothing declared: nothing to refuse


def test_a_multi_target_checkpoint_s_targets_are_its_tags_and_its_source_its_declared_source():
    tags = [">>deu<<", ">>fra<<"]
    marian = FAMILY["marian"]
    # opus-mt-en-mul style: target_lang "mul" names nothing, the tags say which targets there are.
    codes = checkpoint_codes(marian, tags, Directions.of(["en-de", "en-fr"]), {}, "ckpt", ("en", "mul"))
    assert codes == {"de": ">>deu<<", "fr": ">>fra<<"}
    with pytest.raises(DirectionNotTranslated, match=r"translates from en .*'fr' is not its source language"):
        checkpoint_codes(marian, tags, Directions.of(["en-de", "fr-de"]), {}, "ckpt", ("en", "mul"))


def _write_json(directory: Path, name: str, data: object) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(json.dumps(data), encoding="utf-8")


def test_codes_are_read_from_every_file_a_published_tokenizer_keeps_them_in(tmp_path):
    # facebook/mbart-large-50-many-to-many-mmt has no tokenizer.json: its codes are listed as special tokens.
    mmt = tmp_path / "mmt"
    _write_json(mmt, "config.json", {"model_type": "mbart"})
    _write_json(mmt, "tokenizer_config.json", {"tokenizer_class": "MBart50Tokenizer",
                                               "additional_special_tokens": ["de_DE", "en_XX"]})
    _write_json(mmt, "special_tokens_map.json", {"additional_special_tokens": [{"content": "fr_XX"}]})
    assert FAMILY["mbart50"].codes_in(checkpoint_tokens(mmt)) == ["de_DE", "en_XX", "fr_XX"]
    # M2M-100: vocab.json holds the pieces only, the codes come as added tokens; tokenizer.json lists added tokens.
    m2m = tmp_path / "m2m"
    _write_json(m2m, "vocab.json", {"<s>": 0, "▁de": 1})
    _write_json(m2m, "added_tokens.json", {"__de__": 2})
    _write_json(m2m, "tokenizer.json", {"added_tokens": [{"id": 3, "content": "__en__"}],
                                        "model": {"type": "Unigram", "vocab": [["▁x", -1.0]]}})
    _write_json(m2m, "tokenizer_config.json", {"added_tokens_decoder": {"4": {"content": "__fr__"}},
                                               "extra_special_tokens": {"lang": "__cs__"}})
    assert checkpoint_tokens(m2m) >= {"▁de", "▁x", "__de__", "__en__", "__fr__", "__cs__"}
    assert declared_languages(m2m) == (None, None)


def test_files_without_the_codes_a_family_needs_leave_the_check_to_the_loaded_tokenizer(tmp_path):
    # MBart50Tokenizer adds its 52 codes itself when it loads, so files that list none cannot refuse a language.
    listed_none = _checkpoint(tmp_path / "mbart50", "mbart", "MBart50Tokenizer")
    assert check_checkpoint_languages(listed_none, Directions.of(["en-xh"]), {}, "ckpt") is None
    # A Marian tokenizer without its vocab.json: whether it has tags cannot be told.
    no_vocab = _checkpoint(tmp_path / "marian", "marian", "MarianTokenizer")
    assert check_checkpoint_languages(no_vocab, Directions.of(["en-de", "en-fr"]), {}, "ckpt") is None
