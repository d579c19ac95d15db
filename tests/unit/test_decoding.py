"""pipeline/runtime/decoding.py: the one output length rule, and the batching helpers every decoder shares."""

from __future__ import annotations

import numpy as np

from pipeline.runtime.decoding import output_limit, pad_batch, strip_hypothesis, token_batches


def test_the_output_limit_is_a_times_source_length_plus_b_within_the_positions():
    assert output_limit(10, 1.2, 10, 512) == 22
    assert output_limit(7, 0.5, 3, 512) == 6  # rounded down
    # One position is the decoder's start token.
    assert output_limit(100, 1.2, 10, 64) == 63
    assert output_limit(0, 0.0, 0, 64) == 1  # at least the </s>


def test_pad_batch_right_pads_and_masks_the_padding():
    ids, mask = pad_batch([[5, 6, 0], [7, 0]], pad_id=9)
    assert ids.tolist() == [[5, 6, 0], [7, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert ids.dtype == mask.dtype == np.int64


def test_a_hypothesis_is_cut_after_its_first_eos_and_loses_its_padding():
    assert strip_hypothesis([9, 4, 5, 0, 6, 0], eos_id=0, pad_id=9) == [4, 5, 0]
    assert strip_hypothesis([4, 9, 5], eos_id=0, pad_id=9) == [4, 5]


def test_token_batches_hold_rows_times_longest_within_the_budget_and_cover_every_sentence():
    lengths = [5, 1, 30, 7, 7, 2, 60, 3]
    batches = token_batches(lengths, max_tokens=30)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 30
    assert [6] in batches  # longer than the budget alone: a batch of its own
