"""Decoding rules shared by every place that translates: evaluate, the export's parity gate, the ONNX translator,
train-time BLEU and the benches. Imports numpy only, so the training code and `mtpipe translate` can use it.

    output_limit      the most tokens a translation may have (the one home of `max_len_a * src_len + max_len_b`)
    token_batches     sentences grouped by length so that rows x longest stays within a token budget
    pad_batch         id lists right-padded into (ids, mask) arrays
    strip_hypothesis  a generated row cut after its first </s>, without padding
    SpecialIds        the ids a search starts from, ends on and never emits
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SpecialIds:
    """start: the decoder's first input (Marian: <pad>; mBART-50, M2M-100, NLLB: </s>), or None where the
    directions start from different tokens (a v6 manifest of mBART-cc25 with several targets starts from the
    target's code): then each direction's layout gives the start (pipeline.runtime.model_languages, decoder_prefix);
    eos: </s>; pad: padding, never emitted."""

    start: int | None
    eos: int
    pad: int


def output_limit(source_length: int, max_len_a: float, max_len_b: int, max_positions: int) -> int:
    """Most tokens a translation may have (its </s> included): max_len_a * source_length + max_len_b (the fairseq
    convention; source_length counts the source's </s>), within the decoder's positions (one is the start token)."""
    return max(1, min(int(max_len_a * source_length + max_len_b), max_positions - 1))


def limit_after_prefix(source_length: int, max_len_a: float, max_len_b: int, max_positions: int,
                       prefix_length: int) -> int:
    """output_limit for a translation decoded after a decoder prefix this long, within the positions the prefix
    leaves (as the evaluate stage cuts it); at least 1."""
    return max(1, min(output_limit(source_length, max_len_a, max_len_b, max_positions), max_positions - prefix_length))


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id lists into (ids, mask) int64 arrays."""
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length and grouped so rows x longest stays within max_tokens (at least one row each)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * max(lengths[i], 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def strip_hypothesis(ids: Sequence[int], eos_id: int, pad_id: int) -> list[int]:
    """A hypothesis up to and including its first </s>, without padding."""
    ids = list(ids)
    if eos_id in ids:
        ids = ids[: ids.index(eos_id) + 1]
    return [t for t in ids if t != pad_id]


def one_line(text: str) -> str:
    """A decoded translation as one line: a byte-fallback piece can decode to a line break, and output line i must
    stay the translation of input line i."""
    return " ".join(text.splitlines())
