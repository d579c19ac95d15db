"""Encoded corpora as flat memory-mapped arrays (fairseq-like); numpy only, so training needs nothing else.

For each split and side the tokenize stage writes `<split>.<side>.bin` (every sentence's token ids back to back,
uint16 when the vocabulary fits, else int32) and `<split>.<side>.idx.npy` (int64 offsets, n + 1 of them).
Opening a corpus is two memory maps; sentence i is `tokens[offsets[i]:offsets[i+1]]`, a view, not a copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class TokenArrayWriter:
    """Append token-id sequences to `<prefix>.bin` and write the `<prefix>.idx` offsets on close."""

    def __init__(self, prefix: Path, dtype: np.dtype):
        self.prefix, self.dtype = prefix, np.dtype(dtype)
        self._bin = open(_with(prefix, ".bin"), "wb")
        self._offsets = [0]

    def add(self, sequences: list[list[int]]) -> None:
        if not sequences:
            return
        flat = np.fromiter((t for seq in sequences for t in seq), dtype=self.dtype)
        self._bin.write(flat.tobytes())
        ends = np.cumsum([len(s) for s in sequences]) + self._offsets[-1]
        self._offsets.extend(ends.tolist())

    def close(self) -> int:
        self._bin.close()
        np.save(_with(self.prefix, ".idx.npy"), np.asarray(self._offsets, dtype=np.int64))
        return len(self._offsets) - 1


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


def _with(prefix: Path, ext: str) -> Path:
    return prefix.parent / f"{prefix.name}{ext}"


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"
