"""The hub-shaped OPUS-MT tiny checkpoints (tests/support/tiny_checkpoints.py "opus-mt", "opus-mt-multi") are laid out
as transformers' Marian converter wrote the published repositories: what a test that fine-tunes one relies on."""

from __future__ import annotations

import json

import pytest

from pipeline.runtime.families import check_local_checkpoint
from tests.support.tiny_checkpoints import OPUS_MT_NAMES


@pytest.mark.parametrize("name", OPUS_MT_NAMES)
def test_an_opus_mt_checkpoint_has_separate_spms_one_vocab_and_no_tokenizer_class(name, tiny_checkpoint):
    directory = tiny_checkpoint(name)
    assert (directory / "source.spm").read_bytes() != (directory / "target.spm").read_bytes()
    assert not (directory / "target_vocab.json").exists()
    config = json.loads((directory / "config.json").read_text())
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    assert "tokenizer_class" not in config and "tokenizer_class" not in tokenizer_config
    assert tokenizer_config["source_lang"] == "en"
    assert check_local_checkpoint(directory).name == "marian"


@pytest.mark.parametrize("name", OPUS_MT_NAMES)
def test_an_opus_mt_checkpoint_decodes_from_a_zero_pad_row_last_with_the_hub_s_generation_config(
        name, tiny_checkpoint):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    directory = tiny_checkpoint(name)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    pad = tokenizer.pad_token_id
    assert type(tokenizer).__name__ == "MarianTokenizer"
    assert (tokenizer.eos_token_id, tokenizer.unk_token_id, pad) == (0, 1, len(tokenizer) - 1)
    assert pad == model.config.pad_token_id == model.config.vocab_size - 1
    assert model.get_input_embeddings().weight[pad].abs().max().item() == 0.0
    assert model.final_logits_bias[0, pad].item() == 0.0
    generation = json.loads((directory / "generation_config.json").read_text())
    assert {k: generation[k] for k in ("bad_words_ids", "decoder_start_token_id", "pad_token_id", "eos_token_id",
                                       "forced_eos_token_id", "num_beams", "max_length")} == {
        "bad_words_ids": [[pad]], "decoder_start_token_id": pad, "pad_token_id": pad, "eos_token_id": 0,
        "forced_eos_token_id": 0, "num_beams": 4, "max_length": 512}


def test_the_multi_target_checkpoint_s_tags_are_vocabulary_entries_the_tokenizer_splits_off(tiny_checkpoint):
    import sentencepiece as spm
    from transformers import AutoTokenizer

    directory = tiny_checkpoint("opus-mt-multi")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    source = spm.SentencePieceProcessor(model_file=str(directory / "source.spm"))
    for tag in (">>deu<<", ">>fra<<"):
        assert source.piece_to_id(tag) == source.unk_id()  # not a SentencePiece piece
        ids = tokenizer(f"{tag} A dog runs.")["input_ids"]
        assert ids[0] == tokenizer.convert_tokens_to_ids(tag) != tokenizer.unk_token_id
        assert ids[1:] == tokenizer("A dog runs.")["input_ids"]
