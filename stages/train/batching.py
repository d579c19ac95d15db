"""Token-based batches over the encoded arrays (fairseq-like): no padding waste, no tokenization in the loop.

Pairs are sorted by length (ties broken by a seeded shuffle), cut greedily into batches whose padded size
`rows x longest side` stays within `max_tokens`, and the batch order is shuffled every epoch. Which pairs an
epoch's batches hold is sampling.py's business (with one direction: every pair, the same batches every epoch;
with several: a temperature-sampled draw per epoch); this module takes an epoch's batches as given.

One update consumes `world x update_freq` consecutive batches of the epoch's shuffled list, whatever the split
between processes and accumulation steps: update u, micro-batch m of rank r is batch `u*world*update_freq +
m*world + r`. So 2 processes x 1 micro-batch and 1 process x 2 micro-batches train on the same batches per update,
and since every process knows the whole list, each can count the update's target tokens (the loss normaliser)
without communicating. The list is trimmed to a whole number of updates, so every rank gets as many batches (a
rank that ran out early would hang the others in all-reduce). numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.runtime.model_languages import DirectionLayout
from pipeline.token_arrays import TokenArray

IGNORE_INDEX = -100  # label value ignored by the loss


def length_batches(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int,
                   seed: int | Sequence[int]) -> list[np.ndarray]:
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


def batch_target_tokens(tgt_len: np.ndarray, batches: list[np.ndarray]) -> np.ndarray:
    """Each batch's target tokens, from the per-pair target lengths (one vectorised sum, no loop over batches)."""
    if not batches:
        return np.zeros(0, dtype=np.int64)
    starts = np.cumsum([0] + [len(b) for b in batches[:-1]])
    return np.add.reduceat(tgt_len[np.concatenate(batches)], starts).astype(np.int64)


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


@dataclass(frozen=True)
class PlannedUpdate:
    """One update of the run: where it sits in the data and which batches (this rank's micro-batches) it takes."""

    epoch: int
    index: int  # position in the epoch's list of updates
    epoch_updates: int  # how many updates the epoch has
    target_tokens: int  # real target tokens of the whole update, every rank and micro-batch (the loss normaliser)
    batches: list[np.ndarray]  # this rank's micro-batches, in order

    @property
    def ends_epoch(self) -> bool:
        return self.index + 1 == self.epoch_updates


# An epoch's batches (before their shuffle) and each batch's target tokens: sampling.EpochBatches.
EpochSource = Callable[[int], tuple[list[np.ndarray], np.ndarray]]


def planned_updates(epochs: EpochSource, seed: int, rank: int, world: int, update_freq: int, epoch: int = 1,
                    update_in_epoch: int = 0) -> Iterator[PlannedUpdate]:
    """Every update from (epoch, update_in_epoch) on, epoch after epoch, without end (the loop decides when to stop).

    A pure function of its arguments (`epochs` being one of the epoch number): a resumed run, given the
    checkpoint's position, plans the updates the uninterrupted run would have taken."""
    per_update = world * update_freq
    while True:
        batches, batch_tgt_tokens = epochs(epoch)
        mine = epoch_batches(batches, epoch, seed, rank, world, update_freq)
        tokens = update_target_tokens(batch_tgt_tokens, epoch, seed, per_update)
        for u in range(update_in_epoch, len(tokens)):
            yield PlannedUpdate(epoch, u, len(tokens), int(tokens[u]), mine[u * update_freq : (u + 1) * update_freq])
        epoch, update_in_epoch = epoch + 1, 0


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

    def arrays(self) -> dict[str, np.ndarray]:
        """The model's inputs, labels and the flat positions of the real target tokens (loss.TokenLoss), by name."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "decoder_input_ids": self.decoder_input_ids, "labels": self.labels,
                "target_positions": np.flatnonzero(self.labels.reshape(-1) != IGNORE_INDEX)}


class Collator:
    """Pad a batch of pairs: input = source ids; labels = target ids; decoder input = the row's direction's start
    id + labels[:-1], as the family's own model shifts its labels (pipeline/runtime/model_languages.py):

        Marian (the scratch model too)   start <pad>    (shift_tokens_right with decoder_start_token_id = pad)
        mBART-50, M2M-100, NLLB          start </s>     (decoder_start_token_id = eos)
        mBART cc25                       start de_DE    (its wrap-around shift: the label's last token, which is the
                                                         target code, whatever the sentence)

    The start is one id per direction (`layouts[d].decoder_start`) and each row's direction is known
    (`row_directions`, from `<split>.dir.npy`), so the first column is one gather. Truncation to `max_len` keeps
    the sentence's trailing special ids (its layout's suffix: `</s>`, or mBART cc25's `</s> de_DE`), as the
    tokenizers truncate, so the model still learns where sentences end and the start stays the label's last token.
    Without `layouts` every row is of one direction with Marian's: start <pad>, one trailing `</s>`.

    Whole-batch numpy: each side is one gather from the memory-mapped tokens through a (rows x width) position
    matrix, so the cost does not grow with a Python loop over rows."""

    def __init__(self, src: TokenArray, tgt: TokenArray, pad_id: int, max_len: int,
                 row_directions: np.ndarray | None = None, layouts: Sequence[DirectionLayout] | None = None):
        self.src, self.tgt, self.pad_id, self.max_len = src, tgt, pad_id, max_len
        self.layouts = list(layouts) if layouts is not None else None
        self.row_directions = (np.zeros(len(src), dtype=np.int64) if row_directions is None
                               else np.asarray(row_directions, dtype=np.int64))
        # Per direction: the decoder's start id, and how many trailing ids truncation keeps on each side.
        self.decoder_starts = np.array([layout.decoder_start for layout in self.layouts] if self.layouts
                                       else [pad_id], dtype=np.int64)
        self.source_tails = np.array([len(layout.source_suffix) for layout in self.layouts] if self.layouts
                                     else [1], dtype=np.int64)
        self.target_tails = np.array([len(layout.target_suffix) for layout in self.layouts] if self.layouts
                                     else [1], dtype=np.int64)

    def decoder_prefix(self, direction: int) -> tuple[int, ...]:
        """What a translation of the direction is decoded after (its start id, then the target's prefix)."""
        return self.layouts[direction].decoder_prefix if self.layouts else (self.pad_id,)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        return np.minimum(self.src.lengths, self.max_len), np.minimum(self.tgt.lengths, self.max_len)

    def target_tokens(self, batches: list[np.ndarray]) -> np.ndarray:
        """Real target tokens (labels) of each batch, as the collated batch will count them."""
        return batch_target_tokens(self.lengths()[1], batches)

    def truncated(self) -> int:
        return int(((self.src.lengths > self.max_len) | (self.tgt.lengths > self.max_len)).sum())

    def sources(self, indices: np.ndarray) -> list[np.ndarray]:
        """The source ids of these rows, each truncated as in a batch (train-time BLEU decodes them)."""
        ids, _, lengths = self.padded(self.src, np.asarray(indices, dtype=np.int64), self.source_tails)
        return [row[:n] for row, n in zip(ids, lengths.tolist(), strict=True)]

    def padded(self, side: TokenArray, indices: np.ndarray,
               tails: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, inside, lengths): the sentences left-aligned in a rows x longest matrix (positions past a
        sentence's end hold token 0 and inside=False); one longer than max_len keeps its first ids and its last
        `tails[direction]` ones."""
        starts, ends = side.offsets[indices], side.offsets[indices + 1]
        lengths = np.minimum(ends - starts, self.max_len)
        width = int(lengths.max()) if len(indices) else 0
        columns = np.arange(width)
        positions = starts[:, None] + columns[None, :]
        truncated = ends - starts > self.max_len
        if truncated.any():  # then width == max_len; the last `tail` columns read the sentence's last ids
            from_end = width - columns  # 1 in the last column
            tail = tails[self.row_directions[indices[truncated]]]
            positions[truncated] = np.where(from_end[None, :] <= tail[:, None],
                                            ends[truncated][:, None] - from_end[None, :], positions[truncated])
        inside = columns[None, :] < lengths[:, None]
        return side.tokens[np.where(inside, positions, 0)].astype(np.int64), inside, lengths

    def __call__(self, indices: np.ndarray) -> Batch:
        indices = np.asarray(indices, dtype=np.int64)
        src, src_inside, src_len = self.padded(self.src, indices, self.source_tails)
        tgt, tgt_inside, tgt_len = self.padded(self.tgt, indices, self.target_tails)
        input_ids = np.where(src_inside, src, self.pad_id)
        labels = np.where(tgt_inside, tgt, IGNORE_INDEX)
        decoder_input_ids = np.full(labels.shape, self.pad_id, dtype=np.int64)
        if labels.shape[1]:
            decoder_input_ids[:, 0] = self.decoder_starts[self.row_directions[indices]]
        # Column j > 0 is the target's token j - 1, for j < its length (its last token is never an input).
        shifted_inside = np.arange(labels.shape[1] - 1)[None, :] < (tgt_len - 1)[:, None]
        decoder_input_ids[:, 1:] = np.where(shifted_inside, tgt[:, :-1], self.pad_id)
        return Batch(
            input_ids=input_ids,
            attention_mask=(input_ids != self.pad_id).astype(np.int64),
            decoder_input_ids=decoder_input_ids,
            labels=labels,
            src_tokens=int(src_len.sum()),
            tgt_tokens=int(tgt_len.sum()),
        )
