"""The held-out splits, one file per direction, as GX checks them: the pairs as they are, with their direction.

Valid and test splits are normalised but never filtered, and evaluation-sized; each direction's rows are still
streamed into a file of their own (beside the train split's chunks), so every direction gets its own validation
result. A listed direction without rows gets an empty file, whose row count then fails naming it.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.runtime.languages import Direction
from stages.validate.directions import direction_names, group_name, iter_direction_batches

HELDOUT_FILE_SCHEMA = pa.schema(
    [
        ("src", pa.string()),
        ("tgt", pa.string()),
        ("origin", pa.string()),
        ("line", pa.int64()),
        ("direction", pa.string()),
    ]
)


def write_direction_files(
    split_file: Path, work_dir: Path, split: str, directions: list[Direction]
) -> dict[Direction, Path]:
    """Write each direction's rows of `split_file` to `work_dir`/<split>-<direction>.parquet."""
    files = {direction: work_dir / f"{group_name(split, direction)}.parquet" for direction in directions}
    with ExitStack() as stack:
        writers = {d: stack.enter_context(pq.ParquetWriter(path, HELDOUT_FILE_SCHEMA)) for d, path in files.items()}
        for direction, batch in iter_direction_batches(split_file):
            columns = {name: batch.column(name) for name in HELDOUT_FILE_SCHEMA.names if name != "direction"}
            columns["direction"] = direction_names(batch)
            writers[direction].write_batch(pa.RecordBatch.from_pydict(columns, schema=HELDOUT_FILE_SCHEMA))
    return files
