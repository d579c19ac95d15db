"""Pair Parquet files: the format download, clean and validate exchange (src, tgt, src_lang, tgt_lang, origin, line).

Every row carries its own languages, so one file holds every direction of a split; `direction_of_rows` and
`read_pairs_by_direction` group them back.

Encoded token arrays live in pipeline/token_arrays.py (numpy only, so training imports no pyarrow).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.runtime.errors import InputFileError

PAIR_SCHEMA = pa.schema(
    [
        ("src", pa.string()),
        ("tgt", pa.string()),
        ("src_lang", pa.string()),
        ("tgt_lang", pa.string()),
        ("origin", pa.string()),
        ("line", pa.int64()),
    ]
)
BATCH_ROWS = 65_536


def open_pair_file(path: Path, columns: list[str] | None = None) -> pq.ParquetFile:
    """The Parquet file at `path`, checked to hold `columns` (default: every pair column); a missing or unreadable
    file, or one without them, is an InputFileError naming it."""
    columns = columns or PAIR_SCHEMA.names
    try:
        pf = pq.ParquetFile(path, pre_buffer=False)
    except FileNotFoundError:
        raise InputFileError(path, "file not found") from None
    except (pa.ArrowInvalid, OSError) as err:
        raise InputFileError(path, f"not a readable Parquet file ({err})") from None
    missing = [c for c in columns if c not in pf.schema_arrow.names]
    if missing:
        raise InputFileError(path, f"missing column(s) {missing}; has {pf.schema_arrow.names}")
    return pf


def iter_pair_batches(path: Path, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Stream a pair Parquet file in batches of at most BATCH_ROWS rows; a missing or unreadable file, or one
    without the expected columns, is an InputFileError naming it.

    Memory stays flat with the file's size: one row group at a time without Parquet pre-buffering, and freed
    pages handed back to the pool after each (with pre-buffering, reading a 1M-pair split peaked ~90 MB higher
    than a 200k one; this way 155 -> 158 MB).
    """
    pf = open_pair_file(path, columns or PAIR_SCHEMA.names)
    columns = columns or PAIR_SCHEMA.names
    pool = pa.default_memory_pool()
    for group in range(pf.num_row_groups):
        table = pf.read_row_group(group, columns=columns)
        yield from table.to_batches(max_chunksize=BATCH_ROWS)
        del table
        pool.release_unused()


def read_pairs(path: Path) -> tuple[list[str], list[str]]:
    """All (src, tgt) of a split; for evaluation-sized splits only."""
    table = pq.read_table(path, columns=["src", "tgt"])
    return table.column("src").to_pylist(), table.column("tgt").to_pylist()


def direction_column(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """Each row's direction, "src_lang-tgt_lang", as an Arrow column (the one place that spells the rule)."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(batch.column("src_lang"), batch.column("tgt_lang"), "-")


def directions_of(batch: pa.RecordBatch | pa.Table) -> list[str]:
    """Each row's direction, "src_lang-tgt_lang"."""
    return direction_column(batch).to_pylist()


def read_pairs_by_direction(path: Path) -> dict[str, tuple[list[int], list[str], list[str]]]:
    """direction -> (row numbers in the file, src, tgt), directions in order of first appearance; for
    evaluation-sized splits only."""
    table = open_pair_file(path, ["src", "tgt", "src_lang", "tgt_lang"]).read(
        columns=["src", "tgt", "src_lang", "tgt_lang"]
    )
    grouped: dict[str, tuple[list[int], list[str], list[str]]] = {}
    rows = zip(directions_of(table), table.column("src").to_pylist(), table.column("tgt").to_pylist(), strict=True)
    for row, (direction, src, tgt) in enumerate(rows):
        numbers, sources, targets = grouped.setdefault(direction, ([], [], []))
        numbers.append(row)
        sources.append(src)
        targets.append(tgt)
    return grouped


def count_rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows
