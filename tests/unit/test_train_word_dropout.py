"""train.word_dropout: source and decoder-input tokens become <unk> at the rate asked; structure ids, labels never."""

from __future__ import annotations

import pytest
import torch

from pipeline.runtime.errors import PipelineError
from stages.train.word_dropout import WordDropout

PAD, EOS, UNK, TAG = 9, 0, 1, 8  # TAG: a target tag at the start of every source, as a multi-target Marian's


def _inputs(rows: int = 64, width: int = 40) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    words = torch.randint(2, 8, (rows, width), generator=g)
    input_ids = torch.cat([torch.full((rows, 1), TAG), words, torch.full((rows, 1), EOS)], dim=1)
    input_ids[: rows // 2, -5:] = PAD  # half the rows shorter, padded
    labels = torch.cat([words, torch.full((rows, 1), EOS)], dim=1)
    decoder_input_ids = torch.cat([torch.full((rows, 1), PAD), labels[:, :-1]], dim=1)  # Marian starts from <pad>
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(),
            "decoder_input_ids": decoder_input_ids, "labels": labels}


def test_words_drop_at_the_rate_asked_and_nothing_else_changes():
    inputs = _inputs()
    kept = {name: t.clone() for name, t in inputs.items()}
    torch.manual_seed(0)
    dropped = WordDropout(0.25, UNK, [PAD, EOS, TAG], torch.device("cpu"))(inputs)
    for name in ("input_ids", "decoder_input_ids"):
        words = ~torch.isin(kept[name], torch.tensor([PAD, EOS, TAG]))
        changed = dropped[name] != kept[name]
        assert not changed[~words].any(), f"{name}: a <pad>, </s> or tag was dropped"
        assert (dropped[name][changed] == UNK).all()
        assert 0.22 < changed[words].float().mean().item() < 0.28  # 2,560 words a side
    assert dropped["labels"].equal(kept["labels"]) and dropped["attention_mask"].equal(kept["attention_mask"])
    assert all(inputs[name].equal(kept[name]) for name in inputs), "the caller's tensors were written to"


def test_the_masks_follow_torchs_generator_so_a_resumed_run_draws_the_same_ones():
    word_dropout = WordDropout(0.3, UNK, [PAD, EOS, TAG], torch.device("cpu"))
    torch.manual_seed(5)
    first = word_dropout(_inputs())
    torch.manual_seed(5)
    again = word_dropout(_inputs())
    assert all(first[name].equal(again[name]) for name in first)
    assert not word_dropout(_inputs())["input_ids"].equal(first["input_ids"])  # the next draw differs


def test_off_it_returns_the_inputs_and_draws_no_random_numbers():
    inputs = _inputs()
    state = torch.get_rng_state()
    assert WordDropout(0.0, UNK, [PAD, EOS], torch.device("cpu"))(inputs) is inputs
    assert torch.get_rng_state().equal(state)  # so every run without it keeps its dropout masks


def test_a_tokenizer_without_unk_is_refused_naming_the_parameter():
    with pytest.raises(PipelineError, match="train.word_dropout is 0.1, but the tokenizer has no <unk>"):
        WordDropout(0.1, None, [PAD, EOS], torch.device("cpu"))
    assert WordDropout(0.0, None, [PAD, EOS], torch.device("cpu"))(_inputs())["input_ids"].shape == (64, 42)
