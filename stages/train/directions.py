"""The translation direction of every encoded pair, and validation figures per direction and over directions.

The tokenize stage writes, per split, `<split>.dir.npy`: one uint8 per pair (aligned with the token arrays'
rows), an index into languages.json's "directions" (["en-de", "en-fr"]). The trainer reads it for train (sampling.py
draws each epoch's pairs per direction) and valid (loss and BLEU are measured per direction).

What validation reports: `valid/loss` and `valid/bleu` are the MEAN over directions of each direction's figure
(a small direction counts as much as a large one), and that mean is what best.pt, early stopping and the final
model go by. With more than one direction each direction's own figures are logged too, as
`valid/<direction>/loss` and `valid/<direction>/bleu`. With one direction the mean is that direction's figure, so
a one-direction run logs what it always logged. numpy only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import MissingArtifact
from pipeline.runtime.errors import PipelineError
from pipeline.token_arrays import DIRECTIONS_SUFFIX, read_row_directions
from stages.train.batching import length_batches


def row_directions(tokenized: Path, split: str, pairs: int, names: list[str]) -> np.ndarray:
    """Each pair's direction index from `<split>.dir.npy`, checked against the token arrays and the directions."""
    path = tokenized / f"{split}{DIRECTIONS_SUFFIX}"
    if not path.exists():
        raise MissingArtifact(path, "tokenize")
    values = read_row_directions(tokenized / split)
    if values.shape != (pairs,):
        raise PipelineError(f"{path} holds {values.size} directions for the {pairs} pairs of {split}.src/"
                            f"{split}.tgt: the tokenized data is inconsistent; run `dvc repro tokenize`")
    unknown = np.flatnonzero(values >= len(names))
    if len(unknown):
        raise PipelineError(f"{path}, row {unknown[0]}: direction index {values[unknown[0]]}, but languages.json lists "
                            f"{len(names)} direction(s) {names}")
    return values


def rows_by_direction(direction_of_row: np.ndarray, names: list[str], split: str) -> list[np.ndarray]:
    """Each direction's row numbers, in row order; every direction must have some (its figures need them)."""
    rows = [np.flatnonzero(direction_of_row == d) for d in range(len(names))]
    empty = [name for name, r in zip(names, rows, strict=True) if not len(r)]
    if empty:
        raise PipelineError(f"data/tokenized/{split} has no pairs of direction(s) {', '.join(empty)}: every "
                            f"direction of data.directions needs {split} pairs")
    return rows


def valid_batches(src_len: np.ndarray, tgt_len: np.ndarray, rows: list[np.ndarray], max_tokens: int,
                  seed: int) -> list[tuple[int, np.ndarray]]:
    """(direction, row numbers) batches of the valid pairs, each of one direction (its loss is summed apart).

    One direction: the batches length_batches makes of all the valid pairs, as before directions existed."""
    return [(d, r[batch]) for d, r in enumerate(rows)
            for batch in length_batches(src_len[r], tgt_len[r], max_tokens, seed)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def validation_row(names: list[str], losses: list[float], bleus: list[float] | None) -> dict[str, float]:
    """The logged figures: the means over directions, and with several directions each one's own."""
    row = {"valid/loss": mean(losses)}
    if bleus is not None:
        row["valid/bleu"] = mean(bleus)
    if len(names) > 1:
        for d, name in enumerate(names):
            row[f"valid/{name}/loss"] = losses[d]
            if bleus is not None:
                row[f"valid/{name}/bleu"] = bleus[d]
    return row


def per_direction_text(row: dict[str, float], names: list[str]) -> str:
    """Each direction's figures of a validation row for the log line ('' with one direction: the means are its)."""
    if len(names) == 1:
        return ""
    parts = []
    for name in names:
        bleu = row.get(f"valid/{name}/bleu")
        parts.append(f"{name} {row[f'valid/{name}/loss']:.3f}" + ("" if bleu is None else f" BLEU {bleu:.2f}"))
    return "; per direction: " + ", ".join(parts)


def best_figures(history: list[dict[str, float]], best_step: int, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each direction's valid loss and BLEU at the best validation (the logged row of that update; None where
    there is none: no validation gave a finite loss, or BLEU was off)."""
    best = next((row for row in reversed(history) if row.get("step") == best_step and "valid/loss" in row), {})
    return {name: {"best_valid_loss": best.get(f"valid/{name}/loss"), "best_valid_bleu": best.get(f"valid/{name}/bleu")}
            for name in names}
