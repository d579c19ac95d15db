"""Token-based batches over the encoded arrays (fairseq-like): no padding waste, no tokenization in the loop.

Pairs are sorted by length (ties broken by a seeded shuffle), cut greedily into batches whose padded size
`rows x longest side` stays within `max_tokens`, and the batch order is shuffled every epoch. Under DDP each
rank takes every world_size-th batch of the same list, and the list is trimmed so every rank gets as many
batches (a rank that ran out early would hang the others in all-reduce). numpy only.
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


def epoch_batches(batches: list[np.ndarray], epoch: int, seed: int, rank: int, world: int) -> list[np.ndarray]:
    """This rank's batches for one epoch: a seeded shuffle of the whole list, trimmed to a multiple of world."""
    order = np.random.default_rng((seed, epoch)).permutation(len(batches))
    usable = len(order) - len(order) % world
    return [batches[i] for i in order[:usable][rank::world]]


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

    def truncated(self) -> int:
        return int(((self.src.lengths > self.max_len) | (self.tgt.lengths > self.max_len)).sum())

    def _clip(self, seq: np.ndarray) -> np.ndarray:
        # Truncation keeps the final </s> so the model still learns where sentences end.
        return seq if len(seq) <= self.max_len else np.append(seq[: self.max_len - 1], seq[-1])

    def __call__(self, indices: np.ndarray) -> Batch:
        srcs = [self._clip(self.src[i]) for i in indices]
        tgts = [self._clip(self.tgt[i]) for i in indices]
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
