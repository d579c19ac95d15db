"""Encoded corpora as flat memory-mapped arrays (fairseq-like); numpy only, so training needs nothing else.

For each split and side the tokenize stage writes `<split>.<side>.bin` (every sentence's token ids back to back,
uint16 when the vocabulary fits, else int32) and `<split>.<side>.idx.npy` (int64 offsets, n + 1 of them).
Opening a corpus is two memory maps; sentence i is `tokens[offsets[i]:offsets[i+1]]`, a view, not a copy.
Per split, `<split>.dir.npy` holds each pair's direction: a uint8 index into languages.json's "directions", one per row
of the split's arrays (all zeros with one direction).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np

DIRECTIONS_SUFFIX = ".dir.npy"


def flatten(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids -> (all ids back to back, each sequence's length), without a Python loop per token."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    flat = np.fromiter(chain.from_iterable(sequences), dtype=np.int64, count=int(lengths.sum()))
    return flat, lengths


class TokenArrayWriter:
    """Append token-id sequences to `<prefix>.bin` and write the `<prefix>.idx.npy` offsets on close."""

    def __init__(self, prefix: Path, dtype: np.dtype):
        self.prefix, self.dtype = prefix, np.dtype(dtype)
        self._bin = open(_with(prefix, ".bin"), "wb")
        self._ends: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]

    def add(self, sequences: list[list[int]]) -> None:
        self.add_flat(*flatten(sequences))

    def add_flat(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        if not len(lengths):
            return
        self._bin.write(flat.astype(self.dtype, copy=False).tobytes())
        self._ends.append(np.cumsum(lengths) + self._ends[-1][-1])

    def close(self) -> int:
        self._bin.close()
        offsets = np.concatenate(self._ends)
        np.save(_with(self.prefix, ".idx.npy"), offsets)
        return len(offsets) - 1


@dataclass
class TokenArray:
    """A memory-mapped sequence collection: `arr[i]` is sentence i's ids (a view, no copy)."""

    tokens: np.ndarray
    offsets: np.ndarray

    @classmethod
    def open(cls, prefix: Path) -> TokenArray:
        meta = json.loads((prefix.parent / "meta.json").read_text())
        tokens = np.memmap(_with(prefix, ".bin"), dtype=meta["dtype"], mode="r")
        offsets = np.load(_with(prefix, ".idx.npy"), mmap_mode="r")
        return cls(tokens, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def write_row_directions(split_prefix: Path, directions: np.ndarray) -> Path:
    """Save each row's direction index beside `split_prefix`'s arrays (`<split>.dir.npy`)."""
    path = _with(split_prefix, DIRECTIONS_SUFFIX)
    np.save(path, np.asarray(directions, dtype=np.uint8))
    return path


def read_row_directions(split_prefix: Path) -> np.ndarray:
    """Each row's index into languages.json's "directions" (uint8), as the tokenize stage wrote it."""
    return np.load(_with(split_prefix, DIRECTIONS_SUFFIX))


def _with(prefix: Path, ext: str) -> Path:
    return prefix.parent / f"{prefix.name}{ext}"


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"
