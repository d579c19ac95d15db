"""A lexical shortlist: the target tokens a sentence's translation may use, as Marian's and mozilla/translations'
students decode with, so the decoder ranks a few hundred tokens a step instead of the whole vocabulary.

    shortlist.npz   by_source (source vocab, per_source) int32: each source id's likeliest target ids, -1 padded
                    always (frequent,) int32: the target ids every sentence may use (the most frequent ones, </s>)
    shortlist_projection.npz
                    onnx (vocab, d_model) float32, onnx_int8 (vocab, d_model) int8: each target id's output
                    projection column, in the type of that precision's shortlisted graph (the int8 graph holds the
                    columns' scales), which gathers the batch's (sentences, d_model, width) matrix from it

A sentence's shortlist is `always` and the candidates of each of its source ids, sorted and without repeats. It is a
sentence's own, not its batch's (CTranslate2's vocabulary map takes the union over the batch), so a translation does
not depend on which sentences share its batch, and a sentence's list stays a few hundred ids however large the batch
(on Multi30k with per_source 20 and always 100, about 160 of a 4000-piece vocabulary). The export stage builds it
(stages/export/shortlist.py); the shortlisted decoder graph (pipeline/runtime/export_format.py) projects each row
onto its sentence's shortlist only and ranks the next token there, from the columns gathered here once per batch.
Imports numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.runtime.export_format import ExportDirError

SHORTLIST_FILE = "shortlist.npz"


def read_arrays(path: Path, names: tuple[str, ...], what: str) -> tuple[np.ndarray, ...]:
    """The arrays `names` of the export's .npz file `path`; ExportDirError naming the file and what is wrong with it
    otherwise (`what`: what the file should hold)."""
    try:
        with np.load(path) as arrays:
            return tuple(arrays[name] for name in names)
    except FileNotFoundError:
        raise ExportDirError(f"{path} not found (listed in export.json)") from None
    except (KeyError, ValueError, OSError) as err:
        raise ExportDirError(f"{path}: not {what}: {err}") from None


def read_projection(path: Path, precision: str) -> np.ndarray:
    """The (vocab, d_model) projection rows of `precision` (onnx | onnx_int8) in `path`; ExportDirError naming the
    file and what is wrong with it otherwise."""
    (rows,) = read_arrays(path, (precision,), f"a shortlist projection (array {precision})")
    if rows.ndim != 2:
        raise ExportDirError(f"{path}: {precision} must be (vocab, d_model), got shape {rows.shape}")
    return np.ascontiguousarray(rows)


def projection_columns(rows: np.ndarray, shortlists: np.ndarray) -> np.ndarray:
    """(sentences, d_model, width): each sentence's shortlisted ids' columns of the output projection, from its
    (vocab, d_model) rows, laid out as the graph's MatMul reads them."""
    return np.ascontiguousarray(rows[shortlists].transpose(0, 2, 1))


@dataclass(frozen=True)
class Shortlist:
    """by_source: (source vocab, per_source) target ids, -1 where a source id has fewer candidates; always: the
    target ids every sentence's shortlist holds."""

    by_source: np.ndarray
    always: np.ndarray

    @classmethod
    def read(cls, path: Path) -> Shortlist:
        """The shortlist in `path`; ExportDirError naming the file and what is wrong with it otherwise."""
        by_source, always = read_arrays(path, ("by_source", "always"), "a shortlist (arrays by_source and always)")
        if by_source.ndim != 2 or always.ndim != 1 or not always.size:
            raise ExportDirError(f"{path}: by_source must be (source vocab, per_source) and always a non-empty list, "
                                 f"got shapes {by_source.shape} and {always.shape}")
        return cls(by_source.astype(np.int64), always.astype(np.int64))

    def write(self, path: Path) -> None:
        np.savez(path, by_source=self.by_source.astype(np.int32), always=self.always.astype(np.int32))

    def for_batch(self, input_ids: np.ndarray, attention_mask: np.ndarray, pad_id: int, minimum: int) -> np.ndarray:
        """(batch, width) each sentence's shortlist, ascending, padded with `pad_id` (which a shortlisted decoder
        never ranks) to the longest one's width, and to at least `minimum` (the candidates the graph returns).

        Source ids outside by_source (none, for a model's own tokenizer) add no candidates."""
        batch = input_ids.shape[0]
        known = (input_ids < self.by_source.shape[0]) & (attention_mask > 0)
        candidates = self.by_source[np.where(known, input_ids, 0)]  # (batch, src_len, per_source)
        candidates[~known] = -1
        rows = np.concatenate([candidates.reshape(batch, -1), np.broadcast_to(self.always, (batch, self.always.size))],
                              axis=1)
        # Repeats and -1 become a sentinel above every id, sorted to the end, then cut off as far as every row allows.
        sentinel = np.iinfo(np.int64).max
        rows = np.sort(np.where(rows < 0, sentinel, rows), axis=1)
        repeated = np.zeros(rows.shape, dtype=bool)
        repeated[:, 1:] = rows[:, 1:] == rows[:, :-1]
        rows = np.sort(np.where(repeated, sentinel, rows), axis=1)
        width = max(int((rows != sentinel).sum(axis=1).max()), minimum)
        if width > rows.shape[1]:
            rows = np.pad(rows, ((0, 0), (0, width - rows.shape[1])), constant_values=sentinel)
        rows = rows[:, :width]
        rows[rows == sentinel] = pad_id
        return rows
