"""Token-bucketed batches: bounded padded size, every pair once per epoch, equal shares per DDP rank; with
several directions, each epoch's temperature-sampled pairs, a function of the seed and the epoch alone."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.token_arrays import TokenArray, TokenArrayWriter
from stages.train.batching import IGNORE_INDEX, Collator, epoch_batches, length_batches, planned_updates
from stages.train.sampling import EpochBatches, epoch_counts, epoch_sample


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


# ---- the epochs' pairs: one direction as always, several by temperature sampling (stages/train/sampling.py) ----


def direction_rows(sizes):
    """Row numbers per direction for directions of `sizes` pairs stored one after another."""
    bounds = np.cumsum([0, *sizes])
    return [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def epochs_of(sizes, temperature, seed=1, max_tokens=600):
    src, tgt = random_lengths(sum(sizes), seed=5)
    return EpochBatches(src, tgt, direction_rows(sizes), max_tokens, seed, temperature), src, tgt


def pairs_per_direction(batches, sizes):
    """How many of the epoch's pairs each direction contributes."""
    rows = np.concatenate(batches)
    return np.bincount(np.searchsorted(np.cumsum(sizes), rows, side="right"), minlength=len(sizes)).tolist()


def test_one_direction_trains_every_epoch_on_the_batches_it_always_had_only_reshuffled():
    src, tgt = random_lengths()
    epochs = EpochBatches(src, tgt, [np.arange(len(src))], max_tokens=600, seed=1, temperature=5.0)
    before = length_batches(src, tgt, max_tokens=600, seed=1)  # the batches of a run before directions existed
    for epoch in (1, 2, 7):
        batches, tokens = epochs(epoch)
        assert [b.tolist() for b in batches] == [b.tolist() for b in before]
        assert tokens.tolist() == [int(tgt[b].sum()) for b in before]
    # ...so the planned updates are the old ones, epoch after epoch, whatever the temperature.
    plan = planned_updates(epochs, seed=1, rank=0, world=1, update_freq=2)
    old = [b for epoch in (1, 2) for b in epoch_batches(before, epoch, seed=1, rank=0, world=1, update_freq=2)]
    taken = [b for _, update in zip(range(len(old) // 2), plan, strict=False) for b in update.batches]
    assert [b.tolist() for b in taken] == [b.tolist() for b in old]


def test_temperature_1_keeps_the_directions_proportions_and_a_large_one_gives_equal_shares():
    sizes = [3000, 600, 150]
    for temperature, expected in ((1.0, [3000, 600, 150]), (1000.0, [1250, 1250, 1250])):
        epochs, _, _ = epochs_of(sizes, temperature)
        assert epochs.counts == pytest.approx(expected, abs=5)
        for epoch in (1, 2):
            drawn = pairs_per_direction(epochs(epoch)[0], sizes)
            assert drawn == epochs.counts and sum(drawn) == pytest.approx(sum(sizes), abs=2)
    middle, _, _ = epochs_of(sizes, 5.0)  # in between: the small directions gain, the large one gives way
    assert 3000 > middle.counts[0] > 1250 and 150 < middle.counts[2] < 1250


def test_direction_weights_multiply_the_temperature_shares_and_the_epoch_keeps_its_size():
    sizes = [1000, 1000, 1000]
    src, tgt = random_lengths(sum(sizes), seed=5)
    weighted = EpochBatches(src, tgt, direction_rows(sizes), 600, 1, 1.5, weights=[2.0, 1.0, 1.0])
    assert weighted.counts == [1500, 750, 750]
    assert pairs_per_direction(weighted(1)[0], sizes) == [1500, 750, 750]
    # Weights of 1 are no weights: the same epochs, pair for pair.
    plain, _, _ = epochs_of(sizes, 1.5)
    ones = EpochBatches(src, tgt, direction_rows(sizes), 600, 1, 1.5, weights=[1.0, 1.0, 1.0])
    assert [b.tolist() for b in ones(2)[0]] == [b.tolist() for b in plain(2)[0]]
    # They act on the temperature shares, not on the raw sizes: T = 1 and weights [1, 5] over sizes [3000, 600].
    assert epoch_counts([3000, 600], 1.0, [1.0, 5.0]) == [1800, 1800]


def test_an_upsampled_direction_repeats_every_row_alike_and_a_downsampled_one_never_repeats_a_row():
    sizes = [3000, 100]
    epochs, _, _ = epochs_of(sizes, 5.0)
    rows = np.concatenate(epochs(3)[0])
    small = np.bincount(rows[rows >= 3000] - 3000, minlength=100)
    assert epochs.counts[1] > 300 and small.max() - small.min() <= 1
    large = np.bincount(rows[rows < 3000], minlength=3000)
    assert large.max() == 1 and large.sum() == epochs.counts[0] < 3000


def test_an_epochs_pairs_and_batches_depend_only_on_the_seed_and_the_epoch():
    sizes = [900, 300]

    def epoch(number, seed=1, ask_first=()):
        epochs, _, _ = epochs_of(sizes, 2.0, seed=seed)
        for other in ask_first:  # what was computed before must not matter (a resumed run starts mid-way)
            epochs(other)
        batches, tokens = epochs(number)
        return [b.tolist() for b in batches], tokens.tolist()

    assert epoch(3) == epoch(3, ask_first=(1, 2, 5)) == epoch(3, ask_first=(3,))
    assert epoch(3)[0] != epoch(4)[0] and epoch(3)[0] != epoch(3, seed=2)[0]


def test_sampled_batches_mix_directions_stay_within_max_tokens_and_hold_exactly_the_epochs_draw():
    sizes = [900, 300]
    epochs, src, tgt = epochs_of(sizes, 2.0)
    batches, tokens = epochs(2)
    assert sorted(np.concatenate(batches).tolist()) == sorted(epoch_sample(epochs.rows, epochs.counts, 1, 2).tolist())
    assert all(len(b) * max(src[b].max(), tgt[b].max()) <= 600 or len(b) == 1 for b in batches)
    assert tokens.tolist() == [int(tgt[b].sum()) for b in batches]
    mixed = [b for b in batches if (b < 900).any() and (b >= 900).any()]
    assert len(mixed) > len(batches) / 2


def test_a_plan_resumed_mid_epoch_takes_the_updates_of_the_uninterrupted_plan_across_sampled_epochs():
    epochs, _, _ = epochs_of([900, 300], 2.0)
    per_epoch = epochs.updates(1, 2)

    def flat(updates):
        return [(u.epoch, u.index, u.target_tokens, [b.tolist() for b in u.batches]) for u in updates]

    whole = flat(u for _, u in zip(range(3 * per_epoch), planned_updates(epochs, 1, 0, 1, 2), strict=False))
    fresh, _, _ = epochs_of([900, 300], 2.0)  # a new process: nothing cached
    resumed = planned_updates(fresh, 1, 0, 1, 2, epoch=2, update_in_epoch=3)
    tail = flat(u for _, u in zip(range(len(whole) - per_epoch - 3), resumed, strict=False))
    assert tail == whole[per_epoch + 3 :]
    assert {e for e, *_ in whole} == {1, 2, 3} and whole[per_epoch][3] != whole[0][3]
