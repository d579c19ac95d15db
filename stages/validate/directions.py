"""A split's rows grouped by direction: the suite runs once per direction, on that direction's rows only.

A row's direction is what its own src_lang and tgt_lang say. A null language reads as "?" (so "?-de"): such a row
still lands in a group, one whose direction data.directions does not list, and fails the direction expectation
(suite.py) instead of vanishing. Groups come in a fixed order: data.directions' order, then any unlisted
direction in order of first appearance.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.corpus import PAIR_SCHEMA, iter_pair_batches
from pipeline.params import Params
from pipeline.runtime.languages import Direction

MISSING_LANGUAGE = "?"
LANGUAGE_COLUMNS = ["src_lang", "tgt_lang"]
# The splits that must hold rows of every direction (the clean splits contract); a test split may hold any subset.
EVERY_DIRECTION_SPLITS = ("train", "valid")


def listed_directions(params: Params) -> list[Direction]:
    """data.directions, in params order."""
    return list(params.data.directions.directions)


def is_listed(params: Params, direction: Direction) -> bool:
    """Whether data.directions lists `direction` (rows of any other direction are a mistake upstream)."""
    return direction in params.data.directions.directions


def _languages(batch: pa.RecordBatch, column: str) -> pa.Array:
    return pc.fill_null(batch.column(column).cast(pa.string()), MISSING_LANGUAGE)


def direction_names(batch: pa.RecordBatch) -> pa.Array:
    """Each row's direction as its languages say, "src_lang-tgt_lang" (the str() of a Direction)."""
    return pc.binary_join_element_wise(_languages(batch, "src_lang"), _languages(batch, "tgt_lang"), "-")


def rows_by_direction(batch: pa.RecordBatch) -> dict[Direction, np.ndarray]:
    """The 0-based rows of each direction in a batch, in order of first appearance."""
    table = pa.table(
        {
            "src": _languages(batch, "src_lang"),
            "tgt": _languages(batch, "tgt_lang"),
            "row": pa.array(np.arange(len(batch), dtype=np.int64)),
        }
    )
    # Single-threaded grouping keeps the groups in order of first appearance and each group's rows in order.
    grouped = table.group_by(["src", "tgt"], use_threads=False).aggregate([("row", "list")])
    return {
        Direction(src, tgt): np.asarray(rows, dtype=np.int64)
        for src, tgt, rows in zip(
            grouped.column("src").to_pylist(),
            grouped.column("tgt").to_pylist(),
            grouped.column("row_list").to_pylist(),
            strict=True,
        )
    }


def iter_direction_batches(path: Path) -> Iterator[tuple[Direction, pa.RecordBatch]]:
    """Stream a pair file as (direction, a batch of that direction's rows in file order), in bounded memory."""
    for batch in iter_pair_batches(path):
        batch = batch.cast(PAIR_SCHEMA)
        groups = rows_by_direction(batch)
        if len(groups) == 1:
            yield next(iter(groups)), batch
            continue
        for direction, rows in groups.items():
            yield direction, batch.take(pa.array(rows))


def count_by_direction(path: Path) -> dict[Direction, int]:
    """Rows of each direction in a pair file (reading only the language columns), in order of first appearance."""
    counts: dict[Direction, int] = {}
    for batch in iter_pair_batches(path, LANGUAGE_COLUMNS):
        for direction, rows in rows_by_direction(batch).items():
            counts[direction] = counts.get(direction, 0) + len(rows)
    return counts


def directions_to_check(split: str, counts: dict[Direction, int], listed: list[Direction]) -> list[Direction]:
    """The direction groups of a split: every listed direction in train and valid (so a missing one fails its
    row count), the listed ones present in any other split (all of them when none is, so an empty split fails as
    one), then every unlisted direction present."""
    unlisted = [d for d in counts if d not in listed]
    if split in EVERY_DIRECTION_SPLITS:
        return [*listed, *unlisted]
    present = [d for d in listed if d in counts]
    return [*(present or (listed if not unlisted else [])), *unlisted]


def group_name(split: str, direction: Direction) -> str:
    """The name of a split's direction group in file names and in the Data Docs: "train-en-de". Characters other
    than letters, digits and "-" (only an unlisted direction can have them) become "_"."""
    return re.sub(r"[^A-Za-z0-9-]", "_", f"{split}-{direction}")
