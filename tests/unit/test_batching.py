"""Token-bucketed batches: bounded padded size, every pair once per epoch, equal shares per DDP rank."""

from __future__ import annotations

import numpy as np

from pipeline.token_arrays import TokenArray, TokenArrayWriter
from stages.train.batching import IGNORE_INDEX, Collator, epoch_batches, length_batches


def random_lengths(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(2, 60, n), rng.integers(2, 60, n)


def test_batches_stay_within_max_tokens_including_padding():
    src, tgt = random_lengths()
    for batch in length_batches(src, tgt, max_tokens=600, seed=1):
        longest = max(src[batch].max(), tgt[batch].max())
        assert len(batch) * longest <= 600 or len(batch) == 1


def test_every_pair_is_in_exactly_one_batch():
    src, tgt = random_lengths()
    batches = length_batches(src, tgt, max_tokens=600, seed=1)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(src)))


def test_length_bucketing_keeps_padding_low():
    src, tgt = random_lengths()
    batches = length_batches(src, tgt, max_tokens=2000, seed=1)
    real = sum(int(src[b].sum() + tgt[b].sum()) for b in batches)
    padded = sum(2 * len(b) * int(max(src[b].max(), tgt[b].max())) for b in batches)
    assert real / padded > 0.7


def test_epochs_shuffle_batch_order_reproducibly():
    src, tgt = random_lengths()
    batches = length_batches(src, tgt, max_tokens=600, seed=1)
    one = [b.tolist() for b in epoch_batches(batches, 1, seed=1, rank=0, world=1)]
    again = [b.tolist() for b in epoch_batches(batches, 1, seed=1, rank=0, world=1)]
    two = [b.tolist() for b in epoch_batches(batches, 2, seed=1, rank=0, world=1)]
    assert one == again and one != two


def test_ranks_get_disjoint_equal_shares():
    src, tgt = random_lengths()
    batches = length_batches(src, tgt, max_tokens=600, seed=1)
    shares = [epoch_batches(batches, 3, seed=1, rank=r, world=3) for r in range(3)]
    assert len({len(s) for s in shares}) == 1
    seen = [i for share in shares for b in share for i in b.tolist()]
    assert len(seen) == len(set(seen))


def write_arrays(tmp_path, name, seqs):
    (tmp_path / "meta.json").write_text('{"dtype": "uint16"}')
    w = TokenArrayWriter(tmp_path / name, np.dtype("uint16"))
    w.add(seqs)
    w.close()
    return TokenArray.open(tmp_path / name)


def test_collator_shifts_targets_right_behind_the_pad_start_token(tmp_path):
    src = write_arrays(tmp_path, "s", [[5, 6, 0], [7, 0]])
    tgt = write_arrays(tmp_path, "t", [[8, 9, 10, 0], [11, 0]])
    batch = Collator(src, tgt, pad_id=99, max_len=100)(np.array([0, 1]))
    assert batch.input_ids.tolist() == [[5, 6, 0], [7, 0, 99]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch.labels.tolist() == [[8, 9, 10, 0], [11, 0, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch.decoder_input_ids.tolist() == [[99, 8, 9, 10], [99, 11, 99, 99]]
    assert (batch.src_tokens, batch.tgt_tokens) == (5, 6)


def test_truncation_keeps_the_end_of_sentence_token_and_is_counted(tmp_path):
    src = write_arrays(tmp_path, "s", [[1, 2, 3, 4, 5, 0], [7, 0]])
    tgt = write_arrays(tmp_path, "t", [[8, 0], [9, 0]])
    collate = Collator(src, tgt, pad_id=99, max_len=4)
    assert collate(np.array([0])).input_ids.tolist() == [[1, 2, 3, 0]]
    assert collate.truncated() == 1
