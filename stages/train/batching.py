"""Token-based batches over the encoded arrays (fairseq-like): no padding waste, no tokenization in the loop.

Pairs are sorted by length (ties broken by a seeded shuffle), cut greedily into batches whose padded size
`rows x longest side` stays within `max_tokens`, and the batch order is shuffled every epoch.

One update consumes `world x update_freq` consecutive batches of the epoch's shuffled list, whatever the split
between processes and accumulation steps: update u, micro-batch m of rank r is batch `u*world*update_freq +
m*world + r`. So 2 processes x 1 micro-batch and 1 process x 2 micro-batches train on the same batches per update,
and since every process knows the whole list, each can count the update's target tokens (the loss normaliser)
without communicating. The list is trimmed to a whole number of updates, so every rank gets as many batches (a
rank that ran out early would hang the others in all-reduce). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.token_arrays import TokenArray

IGNORE_INDEX = -100  # label value ignored by the loss


def length_batches(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int, seed: int) -> list[np.ndarray]:
    """Indices grouped into batches of at most `max_tokens` padded tokens (max over source and target side)."""
    rng = np.random.default_rng(seed)
    longest = np.maximum(src_len, tgt_len)
    order = np.lexsort((rng.random(len(longest)), tgt_len, longest))  # last key sorts first
    batches, start, width = [], 0, 0
    for i, idx in enumerate(order):
        width = max(width, int(longest[idx]))
        if (i + 1 - start) * width > max_tokens and i > start:
            batches.append(order[start:i])
            start, width = i, int(longest[idx])
    if start < len(order):
        batches.append(order[start:])
    return batches


def epoch_order(n_batches: int, epoch: int, seed: int, per_update: int) -> np.ndarray:
    """The epoch's batch order: a seeded shuffle, trimmed to a multiple of the batches one update consumes."""
    order = np.random.default_rng((seed, epoch)).permutation(n_batches)
    return order[: len(order) - len(order) % per_update]


def epoch_batches(
    batches: list[np.ndarray], epoch: int, seed: int, rank: int, world: int, update_freq: int = 1
) -> list[np.ndarray]:
    """This rank's batches for one epoch, in order; consecutive runs of `update_freq` form one update."""
    order = epoch_order(len(batches), epoch, seed, world * update_freq)
    # Positions rank, rank + world, ...: update u's micro-batch m sits at u*world*update_freq + m*world + rank.
    return [batches[i] for i in order[rank::world]]


def update_target_tokens(batch_tgt_tokens: np.ndarray, epoch: int, seed: int, per_update: int) -> np.ndarray:
    """Real target tokens of each update of the epoch, over all ranks and micro-batches (no communication)."""
    order = epoch_order(len(batch_tgt_tokens), epoch, seed, per_update)
    return batch_tgt_tokens[order].reshape(-1, per_update).sum(axis=1)


@dataclass
class Batch:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    decoder_input_ids: np.ndarray
    labels: np.ndarray
    src_tokens: int  # real (unpadded) tokens, for throughput and padding efficiency
    tgt_tokens: int

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.size + self.labels.size


class Collator:
    """Pad a batch of pairs: source + </s>; decoder input = <pad>(start) + target[:-1]; labels = target + </s>."""

    def __init__(self, src: TokenArray, tgt: TokenArray, pad_id: int, max_len: int):
        self.src, self.tgt, self.pad_id, self.max_len = src, tgt, pad_id, max_len

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        return np.minimum(self.src.lengths, self.max_len), np.minimum(self.tgt.lengths, self.max_len)

    def target_tokens(self, batches: list[np.ndarray]) -> np.ndarray:
        """Real target tokens (labels) of each batch, as the collated batch will count them."""
        tgt = self.lengths()[1]
        return np.array([int(tgt[b].sum()) for b in batches], dtype=np.int64)

    def truncated(self) -> int:
        return int(((self.src.lengths > self.max_len) | (self.tgt.lengths > self.max_len)).sum())

    def clip(self, seq: np.ndarray) -> np.ndarray:
        # Truncation keeps the final </s> so the model still learns where sentences end.
        return seq if len(seq) <= self.max_len else np.append(seq[: self.max_len - 1], seq[-1])

    def __call__(self, indices: np.ndarray) -> Batch:
        srcs = [self.clip(self.src[i]) for i in indices]
        tgts = [self.clip(self.tgt[i]) for i in indices]
        n, s_len, t_len = len(indices), max(map(len, srcs)), max(map(len, tgts))
        input_ids = np.full((n, s_len), self.pad_id, dtype=np.int64)
        labels = np.full((n, t_len), IGNORE_INDEX, dtype=np.int64)
        decoder_input_ids = np.full((n, t_len), self.pad_id, dtype=np.int64)
        for row, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
            input_ids[row, : len(s)] = s
            labels[row, : len(t)] = t
            decoder_input_ids[row, 1 : len(t)] = t[:-1]
        return Batch(
            input_ids=input_ids,
            attention_mask=(input_ids != self.pad_id).astype(np.int64),
            decoder_input_ids=decoder_input_ids,
            labels=labels,
            src_tokens=sum(map(len, srcs)),
            tgt_tokens=sum(map(len, tgts)),
        )
