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


def per_row_reference(src, tgt, indices, pad_id, max_len):
    """The collation spelled out row by row: what the whole-batch Collator must reproduce."""
    def clip(seq):
        return seq if len(seq) <= max_len else np.append(seq[: max_len - 1], seq[-1])

    srcs, tgts = [clip(src[i]) for i in indices], [clip(tgt[i]) for i in indices]
    s_len, t_len = max(map(len, srcs)), max(map(len, tgts))
    input_ids = np.full((len(indices), s_len), pad_id)
    labels = np.full((len(indices), t_len), IGNORE_INDEX)
    decoder_input_ids = np.full((len(indices), t_len), pad_id)
    for row, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        input_ids[row, : len(s)] = s
        labels[row, : len(t)] = t
        decoder_input_ids[row, 1 : len(t)] = t[:-1]
    return input_ids, labels, decoder_input_ids


def test_the_whole_batch_collator_matches_the_row_by_row_rule_truncation_included(tmp_path):
    rng = np.random.default_rng(3)
    src = write_arrays(tmp_path, "s", [rng.integers(1, 90, rng.integers(0, 30)).tolist() + [0] for _ in range(300)])
    tgt = write_arrays(tmp_path, "t", [rng.integers(1, 90, rng.integers(0, 30)).tolist() + [0] for _ in range(300)])
    for max_len in (8, 16, 64):
        collate = Collator(src, tgt, pad_id=99, max_len=max_len)
        batches = length_batches(*collate.lengths(), max_tokens=200, seed=1)
        assert collate.target_tokens(batches).tolist() == [collate(b).tgt_tokens for b in batches]
        for indices in [rng.choice(300, size=n, replace=False) for n in (1, 7, 40)]:
            batch = collate(indices)
            input_ids, labels, decoder_input_ids = per_row_reference(src, tgt, indices, 99, max_len)
            assert np.array_equal(batch.input_ids, input_ids) and batch.input_ids.dtype == np.int64
            assert np.array_equal(batch.labels, labels)
            assert np.array_equal(batch.decoder_input_ids, decoder_input_ids)
            assert np.array_equal(batch.attention_mask, (input_ids != 99).astype(np.int64))
            assert batch.tgt_tokens == int((labels != IGNORE_INDEX).sum())
