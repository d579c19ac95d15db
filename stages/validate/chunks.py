"""The training split's measures, streamed into files of `validate.chunk_rows` rows that GX checks one by one.

Why chunks: GX loads a batch into pandas whole, so one batch of the whole split made the stage's peak memory grow
with the corpus; one file per chunk, each validated as a batch of its own (see gx_runtime.py), keeps it bounded
by the chunk size (bench/README.md has the figures). The split is read row group by row group, so writing the
chunks is bounded too: what grows is the hash set of the pairs seen (8 bytes a pair), which finds repeats across
chunks. The cost is that `validate.mostly` applies within each chunk, and the minimum row count is checked on the
last chunk as the rows the earlier chunks do not supply (see suite.train_chunk_batch).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.corpus import PAIR_SCHEMA, count_rows, iter_pair_batches
from pipeline.errors import ValidationFailed
from pipeline.params import Params
from pipeline.text_checks import SCRIPTS, LanguageDetector, forget_language_model
from stages.validate.measures import DERIVED_FILE_SCHEMA, SplitMeasurer, derive_columns, language_sample


@dataclass(frozen=True)
class Chunk:
    """A file of derived columns for rows first_row ... first_row + rows - 1 (0-based) of the training split."""

    path: Path
    first_row: int
    rows: int

    @property
    def name(self) -> str:
        """The GX asset and suite name: "train" when the split is one chunk, else "train-rows-A-B"."""
        return self.path.stem


def chunk_files(work_dir: Path, rows: int, chunk_rows: int) -> list[Chunk]:
    """Where each chunk's derived columns go: one file named "train", or "train-rows-A-B" (1-based, inclusive)."""
    if rows <= chunk_rows:
        return [Chunk(work_dir / "train.parquet", 0, rows)]
    chunks = []
    for start in range(0, rows, chunk_rows):
        stop = min(start + chunk_rows, rows)
        chunks.append(Chunk(work_dir / f"train-rows-{start + 1}-{stop}.parquet", start, stop - start))
    return chunks


def _language_detector(params: Params) -> LanguageDetector:
    """py3langid restricted to clean.language_id_candidates and the pair's two languages."""
    try:
        return LanguageDetector([*params.clean.language_id_candidates, params.data.src_lang, params.data.tgt_lang])
    except ValueError as err:
        raise ValidationFailed(f"language check: {err}") from None


def write_measure_chunks(train_file: Path, work_dir: Path, params: Params) -> tuple[list[Chunk], int]:
    """Stream the train split through derive_columns into chunk files in `work_dir`, in bounded memory; returns
    the chunks and how many rows the language sample covered."""
    rows = count_rows(train_file)
    settings = params.validate_
    sample = language_sample(rows, settings.language_sample, settings.seed)
    chunks = chunk_files(work_dir, rows, settings.chunk_rows)
    with ThreadPoolExecutor(2) as pool, ExitStack() as files:
        writers = [files.enter_context(pq.ParquetWriter(chunk.path, DERIVED_FILE_SCHEMA)) for chunk in chunks]
        measurer = SplitMeasurer(
            src_script=SCRIPTS.get(params.data.src_lang),
            tgt_script=SCRIPTS.get(params.data.tgt_lang),
            ratio_min_chars=params.clean.ratio_min_chars,
            language_id_min_chars=params.clean.language_id_min_chars,
            pool=pool,
            language_sample=sample,
            detector=_language_detector(params) if len(sample) else None,
        )
        first_row = 0
        for batch in iter_pair_batches(train_file):
            derived = derive_columns(batch.cast(PAIR_SCHEMA), measurer, first_row)
            # The batch's rows, cut at chunk boundaries.
            last_row = first_row + len(batch)
            for i in range(first_row // settings.chunk_rows, (last_row - 1) // settings.chunk_rows + 1):
                start = max(chunks[i].first_row, first_row) - first_row
                stop = min(chunks[i].first_row + chunks[i].rows, last_row) - first_row
                writers[i].write_batch(derived.slice(start, stop - start))
            first_row = last_row
    # The detector's model and the hash set are not needed while GX holds a chunk: hand their memory back first.
    del measurer
    forget_language_model()
    return chunks, len(sample)
