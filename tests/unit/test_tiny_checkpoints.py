"""The tiny checkpoints (tests/support/tiny_checkpoints.py) are what the families' published checkpoints are: loadable
by the Auto classes, detected as their family, every language code where the family puts it, a model that covers
the tokenizer and trains on its ids."""

from __future__ import annotations

import json

import pytest

from pipeline.runtime.families import FAMILIES, Family, check_local_checkpoint, language_codes
from tests.support.tiny_checkpoints import FAMILY_NAMES, MARIAN_TAGS, build_tiny

SOURCE, TARGET = "The dog runs on the beach.", "Der Hund läuft am Strand."
# (family, directions' languages whose codes the tokenizer must have)
LANGUAGES = {"marian": [], "marian-multi": ["de", "fr", "cs"], "mbart": ["en", "de", "fr", "cs"],
             "mbart50": ["en", "de", "fr", "cs"], "m2m100": ["en", "de", "fr", "cs"],
             "nllb": ["en", "de", "fr", "cs"]}


def _loaded(tiny_checkpoint, family: str):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    directory = tiny_checkpoint(family)
    return directory, AutoTokenizer.from_pretrained(directory), AutoModelForSeq2SeqLM.from_pretrained(directory)


def family_named(family: str) -> Family:
    """The pipeline's Family a tiny checkpoint family is ("marian-multi" is a marian checkpoint)."""
    name = "marian" if family == "marian-multi" else family
    return next(f for f in FAMILIES if f.name == name)


def _codes(family: str, tokenizer) -> dict[str, str]:
    return language_codes(family_named(family), LANGUAGES[family], tokenizer.get_vocab(), {}, family)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_loads_with_the_auto_classes_as_its_family(tiny_checkpoint, family):
    directory, tokenizer, model = _loaded(tiny_checkpoint, family)
    expected = family_named(family)
    assert check_local_checkpoint(directory) == expected
    assert model.config.model_type == expected.model_type
    assert type(tokenizer).__name__ in expected.tokenizer_classes


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_model_covers_every_id_of_the_tokenizer(tiny_checkpoint, family):
    _, tokenizer, model = _loaded(tiny_checkpoint, family)
    codes = family_named(family).codes_in(tokenizer.get_vocab())
    code_ids = tokenizer.convert_tokens_to_ids(codes)
    assert len(tokenizer) <= model.config.vocab_size
    assert max([*code_ids, len(tokenizer) - 1]) < model.config.vocab_size
    assert model.get_input_embeddings().weight.shape[0] == model.config.vocab_size
    # Tied as in the published checkpoints: the output projection is the embedding matrix.
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if LANGUAGES[f]])
def test_the_tokenizer_has_every_code_of_its_family(tiny_checkpoint, family):
    _, tokenizer, _ = _loaded(tiny_checkpoint, family)
    expected = {"marian-multi": {"de": ">>deu<<", "fr": ">>fra<<", "cs": ">>ces<<"},
                "mbart": {"en": "en_XX", "de": "de_DE", "fr": "fr_XX", "cs": "cs_CZ"},
                "mbart50": {"en": "en_XX", "de": "de_DE", "fr": "fr_XX", "cs": "cs_CZ"},
                "m2m100": {"en": "__en__", "de": "__de__", "fr": "__fr__", "cs": "__cs__"},
                "nllb": {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn", "cs": "ces_Latn"}}[family]
    assert _codes(family, tokenizer) == expected
    all_codes = family_named(family).codes_in(tokenizer.get_vocab())
    real_count = {"marian-multi": len(MARIAN_TAGS), "mbart": 25, "mbart50": 52, "m2m100": 100, "nllb": 202}
    assert len(all_codes) == real_count[family]


def _set_languages(tokenizer, family: str, src: str, tgt: str) -> dict[str, str]:
    codes = _codes(family, tokenizer) if LANGUAGES[family] else {}
    if family == "m2m100":  # M2M100Tokenizer takes the bare language ("en"), its code is "__en__"
        tokenizer.src_lang, tokenizer.tgt_lang = codes[src].strip("_"), codes[tgt].strip("_")
    elif family not in ("marian", "marian-multi"):
        tokenizer.src_lang, tokenizer.tgt_lang = codes[src], codes[tgt]
    return codes


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_codes_land_where_the_family_puts_them(tiny_checkpoint, family):
    _, tokenizer, model = _loaded(tiny_checkpoint, family)
    codes = _set_languages(tokenizer, family, "en", "de")
    source_text = f">>fra<< {SOURCE}" if family == "marian-multi" else SOURCE
    encoded = tokenizer(source_text, text_target=TARGET)
    source_pieces = tokenizer(SOURCE, add_special_tokens=False).input_ids
    target_pieces = tokenizer(text_target=TARGET, add_special_tokens=False).input_ids
    eos = tokenizer.eos_token_id

    if family == "marian":
        expected = (source_pieces + [eos], target_pieces + [eos])
    elif family == "marian-multi":  # the tag is text in front of the source: one piece
        expected = ([tokenizer.convert_tokens_to_ids(">>fra<<"), *source_pieces, eos], target_pieces + [eos])
    else:
        en, de = tokenizer.convert_tokens_to_ids([codes["en"], codes["de"]])
        if family == "mbart":
            expected = (source_pieces + [eos, en], target_pieces + [eos, de])
        else:
            expected = ([en, *source_pieces, eos], [de, *target_pieces, eos])
    assert (encoded.input_ids, encoded.labels) == expected
    assert len(source_pieces) > 3 and tokenizer.unk_token_id not in source_pieces + target_pieces


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_decoder_starts_as_the_family_does(tiny_checkpoint, family):
    _, tokenizer, model = _loaded(tiny_checkpoint, family)
    start = model.config.decoder_start_token_id
    if family.startswith("marian"):
        # OPUS-MT: <pad> is the last id, the decoder's start, and its embedding row is zero.
        assert start == tokenizer.pad_token_id == len(tokenizer) - 1
        assert not model.get_input_embeddings().weight[start].any()
    elif family == "mbart":
        assert start is None  # mbart-large-cc25: labels shifted with a wrap-around, no start token
    else:
        assert start == tokenizer.eos_token_id


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_forward_pass_with_labels_gives_a_finite_loss(tiny_checkpoint, family):
    import torch

    _, tokenizer, model = _loaded(tiny_checkpoint, family)
    _set_languages(tokenizer, family, "en", "de")
    batch = tokenizer([SOURCE, "A woman reads."], text_target=[TARGET, "Eine Frau liest ein Buch."],
                      padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    with torch.no_grad():
        loss = model(**batch).loss
    assert torch.isfinite(loss) and loss > 0


def test_the_tokenizer_config_names_its_class_and_no_loading_details(tiny_checkpoint):
    config = json.loads((tiny_checkpoint("mbart50") / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "MBart50Tokenizer"
    assert not {"is_local", "local_files_only", "unk_id"} & set(config)


def test_build_tiny_copies_into_the_given_directory(tmp_path):
    out = build_tiny("m2m100", tmp_path / "copy")
    assert out == tmp_path / "copy"
    assert {"config.json", "model.safetensors", "vocab.json", "sentencepiece.bpe.model",
            "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    with pytest.raises(ValueError, match="unknown family 'bart'.*marian-multi"):
        build_tiny("bart", tmp_path / "bart")


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_decoding_without_special_tokens_drops_the_codes(tiny_checkpoint, family):
    # The codes are special tokens, as in the published tokenizers: a hypothesis decodes to its text alone.
    # (Marian's tags are ordinary pieces, as in OPUS-MT: only ever in front of a source, never decoded.)
    _, tokenizer, _ = _loaded(tiny_checkpoint, family)
    _set_languages(tokenizer, family, "en", "de")
    labels = tokenizer(text_target=TARGET).input_ids
    assert tokenizer.decode(labels, skip_special_tokens=True) == TARGET
