"""clean: normalise every split and filter the training pairs; every rejected row is kept with its reason.

Every row carries its own languages (src_lang, tgt_lang), and a file may mix directions: everything that depends
on a language uses the row's own, and everything that compares pairs stays within the row's direction. Valid and
test splits are normalised but never filtered, so scores stay comparable; they are read first, so that training
pairs can be checked against them. Everything streams over the raw row groups, vectorised with pyarrow.compute,
the two sides of a batch on two threads:
- normalization.py: the normalisation of every split (HTML, invisible characters, NFC or NFKC, punctuation,
  whitespace), each side in its row's language.
- moses.py: sacremoses' punctuation normalisation as RE2 replacements over whole arrays, checked against sacremoses.
- filters.py: the training filters in the order of REASONS, row-level masks and the corpus-level ones (overlap with
  valid/test, duplicates, language), and Cleaner, the state of one run.
- tally.py: each split's rows in, kept and rejected per direction, and the checks that no row was lost and that
  every direction keeps training and validation pairs.

Output: `data/clean/<split>.parquet` (PAIR_SCHEMA), `data/clean/rejected.parquet` (split, the pair columns,
reason) and `metrics/clean.json` (totals, per split, and per direction and split). A row whose direction is not in
`data.directions` stops the stage naming the file and the direction.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import PAIR_SCHEMA, count_rows, direction_column, iter_pair_batches
from pipeline.errors import MissingArtifact
from pipeline.params import Params
from pipeline.runtime.errors import InputFileError
from pipeline.runtime.languages import Directions
from stages.clean.filters import Cleaner
from stages.clean.tally import SplitTally, check_every_direction_trains

log = logging.getLogger("mtpipe.clean")

REJECTED_SCHEMA = pa.schema([("split", pa.string()), *PAIR_SCHEMA, ("reason", pa.string())])


def direction_labels(batch: pa.RecordBatch) -> pa.Array:
    """Each row's direction, "src_lang-tgt_lang" (null where a language is missing)."""
    return direction_column(batch)


def check_row_directions(batch: pa.RecordBatch, labels: pa.Array, source: Path, directions: Directions) -> None:
    """Every row names its languages, and its direction is one of data.directions; InputFileError naming the file
    (and the line of a row without languages) otherwise."""
    if labels.null_count:
        row = int(pc.index(pc.is_null(labels), True).as_py())
        raise InputFileError(source, "a row without src_lang/tgt_lang (every row names its languages): rerun the "
                             "download stage", line=batch.column("line")[row].as_py())
    unknown = sorted(set(pc.unique(labels).to_pylist()) - set(directions.names))
    if unknown:
        raise InputFileError(source, f"rows of direction(s) {', '.join(unknown)}, which data.directions "
                             f"({', '.join(directions.names)}) does not list: rerun the download stage")


def run(params: Params, paths: Paths) -> dict[str, Any]:
    if not paths.raw.exists():
        raise MissingArtifact(paths.raw, "download")
    splits = splits_in(paths.raw)
    if "train" not in splits:
        raise MissingArtifact(paths.split_file(paths.raw, "train"), "download")
    directions = params.data.directions
    # Valid and test splits first: their pairs must be known before training pairs can be checked against them.
    order = [s for s in splits if s != "train"] + ["train"]
    tallies: dict[str, SplitTally] = {}
    with atomic_path(paths.clean) as out:
        out.mkdir()
        with pq.ParquetWriter(out / "rejected.parquet", REJECTED_SCHEMA) as rejected_writer:
            cleaner = Cleaner(params.clean, directions)
            try:
                for split in order:
                    source = paths.split_file(paths.raw, split)
                    tallies[split] = _clean_split(cleaner, split, source, out, rejected_writer)
            finally:
                cleaner.close()
            log.info("deduplication kept %d pair hashes in %.1f MB", len(cleaner.seen), cleaner.seen.nbytes / 2**20)
        check_every_direction_trains(tallies, directions)
    report = {split: tallies[split].totals() for split in splits}  # train first again, as the files list them
    totals = {k: sum(r[k] for r in report.values()) for k in ("input", "kept", "rejected")}
    per_direction = {
        d: {**{split: tallies[split].of(d) for split in splits}, "reasons": tallies["train"].reasons_of(d)}
        for d in directions.names
    }
    write_json(paths.metrics("clean"), {**totals, "splits": report, "directions": per_direction})
    train = report["train"]
    log.info("train: kept %d of %d pairs; rejected %s", train["kept"], train["input"], train["reasons"])
    if len(directions.names) > 1:
        for d, figures in per_direction.items():
            log.info("train %s: kept %d of %d pairs; rejected %s", d, figures["train"]["kept"],
                     figures["train"]["input"], figures["reasons"])
    return {"train_kept": train["kept"], "train_rejected": train["rejected"]}


def _clean_split(
    cleaner: Cleaner, split: str, source: Path, out: Path, rejected_writer: pq.ParquetWriter
) -> SplitTally:
    from tqdm import tqdm

    tally = SplitTally(split, source)
    # disable=None: a bar on a terminal only; a log file (DVC, CI, Prefect) gets none of its redraws.
    progress = tqdm(total=count_rows(source), desc=f"clean {split}", unit="pairs", unit_scale=True, mininterval=2,
                    disable=None)
    with pq.ParquetWriter(out / f"{split}.parquet", PAIR_SCHEMA) as writer, progress:
        for batch in iter_pair_batches(source):
            batch = batch.cast(PAIR_SCHEMA)
            labels = direction_labels(batch)
            check_row_directions(batch, labels, source, cleaner.directions)
            if split == "train":
                batch, reason = cleaner.train_split(batch, labels)
            else:
                batch, reason = cleaner.eval_split(batch, labels), np.full(len(batch), None, dtype=object)
            rejected = reason != None  # noqa: E711 - elementwise comparison
            if rejected.any():
                _write_rejected(rejected_writer, split, batch.filter(pa.array(rejected)), reason[rejected].tolist())
            kept = pa.array(~rejected)
            writer.write_batch(batch.filter(kept))
            tally.add(labels, labels.filter(kept), labels.filter(pa.array(rejected)), reason[rejected].tolist())
            progress.update(len(batch))
    tally.check()
    return tally


def _write_rejected(writer: pq.ParquetWriter, split: str, bad: pa.RecordBatch, reasons: list[str]) -> None:
    columns = [pa.array([split] * len(bad), pa.string()), *bad.columns, pa.array(reasons, pa.string())]
    writer.write_batch(pa.record_batch(columns, schema=REJECTED_SCHEMA))
