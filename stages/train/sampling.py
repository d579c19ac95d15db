"""Which pairs each epoch trains on: with several directions, a fresh temperature-sampled draw every epoch.

fairseq's translation_multi_simple_epoch, in numpy. An epoch holds about N pairs, N the training pairs of every
direction together; direction d gets round(p_d * N) of them, p = pipeline.runtime.languages.temperature_shares(pairs
per direction, train.temperature) (p ∝ n ** (1 / T): T = 1 keeps the data's proportions, a larger T flattens them
towards equal shares), each multiplied by its train.direction_weights entry and normalised again. Its pairs are
drawn as permutations of its rows, as many as needed, cut to that count: an upsampled direction repeats each of its
rows as often as any other, give or take one; a downsampled one trains on a different subset each epoch. The drawn
pairs are then cut into token-bucketed batches (batching.length_batches), so a batch holds pairs of similar lengths
from any direction.

Every draw is seeded from (train.seed, epoch): every rank computes the same epoch without communicating, and a
resumed run, given the epoch and its position in it (the checkpoint's progress), trains on the same batches as
the uninterrupted run. One direction is not sampled at all: its batches are those length_batches makes of every
pair once, fixed for the whole run (each epoch only shuffles their order, batching.epoch_order), exactly as a
one-direction run always trained. numpy (and the stdlib pipeline.runtime.languages) only.
"""

from __future__ import annotations

import numpy as np

from pipeline.runtime.languages import temperature_shares
from stages.train.batching import batch_target_tokens, length_batches

# An epoch's seed streams besides batching.epoch_order's SeedSequence((seed, epoch)). SeedSequence ignores
# trailing zero words, so every tuple here ends in a non-zero one: (seed, epoch, SAMPLE_STREAM, direction + 1)
# and (seed, epoch, TIES_STREAM).
SAMPLE_STREAM = 1
TIES_STREAM = 2


def epoch_counts(sizes: list[int], temperature: float, weights: list[float] | None = None) -> list[int]:
    """Pairs each direction contributes to an epoch of sum(sizes) pairs: round(p_d * N), p the temperature shares
    times `weights` (one per direction; None: all 1), normalised."""
    total = sum(sizes)
    shares = temperature_shares(dict(enumerate(sizes)), temperature)
    weighted = [shares[d] * (1.0 if weights is None else weights[d]) for d in range(len(sizes))]
    norm = sum(weighted)
    return [round(w / norm * total) for w in weighted]


def epoch_sample(rows: list[np.ndarray], counts: list[int], seed: int, epoch: int) -> np.ndarray:
    """The epoch's pairs (row numbers), direction after direction: per direction, `count` rows taken from
    concatenated fresh permutations of its rows. A function of (seed, epoch) alone."""
    drawn = []
    for d, (direction_rows, count) in enumerate(zip(rows, counts, strict=True)):
        rng = np.random.default_rng((seed, epoch, SAMPLE_STREAM, d + 1))
        rounds = -(-count // len(direction_rows))  # ceil
        permutations = [direction_rows[rng.permutation(len(direction_rows))] for _ in range(rounds)]
        drawn.append(np.concatenate(permutations)[:count] if permutations else direction_rows[:0])
    return np.concatenate(drawn).astype(np.int64, copy=False)


class EpochBatches:
    """`epochs(e)` -> (the batches of epoch e before their per-epoch shuffle, each batch's real target tokens).

    `rows` holds each direction's row numbers, `weights` each direction's sampling weight (None: all 1); the
    lengths are the Collator's (clipped to train.max_len), so the target tokens are what the collated batches count
    (the loss normaliser)."""

    def __init__(self, src_len: np.ndarray, tgt_len: np.ndarray, rows: list[np.ndarray], max_tokens: int,
                 seed: int, temperature: float, weights: list[float] | None = None):
        self.src_len, self.tgt_len, self.rows = src_len, tgt_len, rows
        self.max_tokens, self.seed = max_tokens, seed
        self.counts = epoch_counts([len(r) for r in rows], temperature, weights)
        self._fixed: tuple[list[np.ndarray], np.ndarray] | None = None
        self._last: tuple[int, tuple[list[np.ndarray], np.ndarray]] | None = None
        if len(rows) == 1:  # one direction: every pair once, the same batches every epoch
            batches = length_batches(src_len, tgt_len, max_tokens, seed)
            self._fixed = (batches, batch_target_tokens(tgt_len, batches))

    def __call__(self, epoch: int) -> tuple[list[np.ndarray], np.ndarray]:
        if self._fixed is not None:
            return self._fixed
        last = self._last  # one read: the batch thread and the loop may both ask
        if last is None or last[0] != epoch:
            last = (epoch, self.sampled(epoch))
            self._last = last
        return last[1]

    def sampled(self, epoch: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Several directions: this epoch's draw, cut into length batches (ties broken by the epoch's own seed)."""
        pairs = epoch_sample(self.rows, self.counts, self.seed, epoch)
        positions = length_batches(self.src_len[pairs], self.tgt_len[pairs], self.max_tokens,
                                   (self.seed, epoch, TIES_STREAM))
        batches = [pairs[p] for p in positions]
        return batches, batch_target_tokens(self.tgt_len, batches)

    def updates(self, epoch: int, per_update: int) -> int:
        """How many updates of `per_update` batches epoch `epoch` has."""
        return len(self(epoch)[0]) // per_update
