"""The training split's measures, streamed into files of `validate.chunk_rows` rows of one direction each, that GX
checks one by one.

Why chunks: GX loads a batch into pandas whole, so one batch of the whole split made the stage's peak memory grow
with the corpus; one file per chunk, each validated as a batch of its own (see gx_runtime.py), keeps it bounded
by the chunk size (bench/README.md has the figures). Why per direction: each direction is checked against its own
languages and reported on its own (directions.py), so a chunk holds rows of one direction; each direction's rows
are numbered from 1 in the chunk names ("train-en-de-rows-1-250000"). The split is read row group by row group,
so writing the chunks is bounded too: what grows is the hash set of the pairs seen (8 bytes a pair), which finds
repeats across chunks. The cost is that `validate.mostly` applies within each chunk, and a direction's minimum row
count is checked on its last chunk as the rows its earlier chunks do not supply (see suite.train_chunk_batch).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import ValidationFailed
from pipeline.params import Params
from pipeline.runtime.languages import SCRIPTS, Direction
from pipeline.text_checks import LanguageDetector, forget_language_model
from stages.validate.directions import group_name, is_listed, iter_direction_batches
from stages.validate.measures import DERIVED_FILE_SCHEMA, SplitMeasurer, derive_columns, language_sample


@dataclass(frozen=True)
class Chunk:
    """A file of derived columns for rows first_row ... first_row + rows - 1 (0-based) of one direction's rows of
    the training split."""

    path: Path
    direction: Direction
    first_row: int
    rows: int

    @property
    def name(self) -> str:
        """The GX asset and suite name: "train-en-de" when the direction is one chunk, else "train-en-de-rows-A-B"."""
        return self.path.stem


@dataclass(frozen=True)
class DirectionChunks:
    """One direction's rows of the training split as chunk files, and how many of them the language sample
    covered."""

    direction: Direction
    rows: int
    chunks: list[Chunk]
    language_sample_rows: int


def chunk_files(work_dir: Path, direction: Direction, rows: int, chunk_rows: int) -> list[Chunk]:
    """Where each chunk of a direction goes: one file "train-<direction>", or "train-<direction>-rows-A-B" (1-based,
    inclusive)."""
    stem = group_name("train", direction)
    if rows <= chunk_rows:
        return [Chunk(work_dir / f"{stem}.parquet", direction, 0, rows)]
    chunks = []
    for start in range(0, rows, chunk_rows):
        stop = min(start + chunk_rows, rows)
        chunks.append(Chunk(work_dir / f"{stem}-rows-{start + 1}-{stop}.parquet", direction, start, stop - start))
    return chunks


def _language_detector(params: Params) -> LanguageDetector:
    """py3langid restricted to clean.language_id_candidates and every language of data.directions: the same
    candidates for every direction, so a side in another listed language is detected as that language."""
    try:
        return LanguageDetector([*params.clean.language_id_candidates, *params.data.directions.languages])
    except ValueError as err:
        raise ValidationFailed(f"language check: {err}") from None


def _measurer(
    params: Params, direction: Direction, rows: int, pool: ThreadPoolExecutor, detector: LanguageDetector | None
) -> SplitMeasurer:
    """A measurer of one direction's rows; only a direction data.directions lists is language-checked."""
    settings = params.validate_
    sample = language_sample(rows, settings.language_sample if is_listed(params, direction) else 0, settings.seed)
    return SplitMeasurer(
        src_script=SCRIPTS.get(direction.src),
        tgt_script=SCRIPTS.get(direction.tgt),
        ratio_min_chars=params.clean.ratio_min_chars,
        language_id_min_chars=params.clean.language_id_min_chars,
        pool=pool,
        language_sample=sample,
        detector=detector if len(sample) else None,
    )


def _write_rows(derived: pa.RecordBatch, first_row: int, chunks: list[Chunk], writers: list, chunk_rows: int) -> None:
    """A batch of one direction's derived rows, starting at its row `first_row`, cut at chunk boundaries."""
    last_row = first_row + len(derived)
    for i in range(first_row // chunk_rows, (last_row - 1) // chunk_rows + 1):
        start = max(chunks[i].first_row, first_row) - first_row
        stop = min(chunks[i].first_row + chunks[i].rows, last_row) - first_row
        writers[i].write_batch(derived.slice(start, stop - start))


def write_measure_chunks(
    train_file: Path, work_dir: Path, params: Params, rows: dict[Direction, int]
) -> list[DirectionChunks]:
    """Stream the train split through derive_columns into chunk files in `work_dir`, in bounded memory: one group
    of chunks for each direction of `rows` (its rows in the split, 0 for a listed direction without any)."""
    chunk_rows = params.validate_.chunk_rows
    chunks = {direction: chunk_files(work_dir, direction, n, chunk_rows) for direction, n in rows.items()}
    needs_detector = params.validate_.language_sample > 0 and any(rows.values())
    detector = _language_detector(params) if needs_detector else None
    with ThreadPoolExecutor(2) as pool, ExitStack() as files:
        writers = {
            d: [files.enter_context(pq.ParquetWriter(c.path, DERIVED_FILE_SCHEMA)) for c in cs]
            for d, cs in chunks.items()
        }
        measurers = {d: _measurer(params, d, n, pool, detector) for d, n in rows.items()}
        done = dict.fromkeys(rows, 0)
        for direction, batch in iter_direction_batches(train_file):
            derived = derive_columns(batch, measurers[direction], done[direction])
            _write_rows(derived, done[direction], chunks[direction], writers[direction], chunk_rows)
            done[direction] += len(batch)
    sampled = {d: len(m.language_sample) for d, m in measurers.items()}
    # The detector's model and the hash sets are not needed while GX holds a chunk: hand their memory back first.
    del measurers, detector
    forget_language_model()
    return [DirectionChunks(d, rows[d], chunks[d], sampled[d]) for d in rows]
