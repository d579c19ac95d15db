"""validate: check the cleaned splits with a Great Expectations suite before anything is trained on them.

The clean stage filters the training split and normalises every split; this stage checks that its output holds
what the rest of the pipeline assumes, so a bug or a changed threshold upstream stops the DAG here instead of
surfacing later as a bad model. The clean stage's thresholds (`params.clean`) are the bounds.

The whole training split is validated, every row, in memory that does not grow with the corpus:
- measures.py: the per-row measures GX checks instead of the text (lengths, ratio, copies, repeats, shares,
  languages); language is detected on a seeded sample of `validate.language_sample` rows, since a full pass would
  cost as much as the clean stage's optional language filter; every other expectation sees every row.
- chunks.py: the training split streamed into files of those measures, one per `validate.chunk_rows` rows.
- suite.py: the expectations, built from params, each with `meta={"critical": bool}`.
- gx_runtime.py: GX itself, one checkpoint per chunk (and per held-out split), each page added to one Data Docs
  site in `reports/validation/`.
- offline_docs.py: that site made to load nothing from another host (the web assets of `assets/web` copied
  beside it, GX's logo and favicon links pointed at the site's own files).
- merge.py: the chunks' results merged into one summary of the split.
- example_text.py: the text of failed expectations' example rows, looked up in the split by origin and line.
- report.py: `metrics/validation.json`, the log, and `ValidationFailed` when a critical expectation failed; the
  Data Docs and the metrics file are written first, so the report is there to inspect.

Importing this package imports neither Great Expectations nor pandas: importing GX alone takes seconds.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import count_rows, open_pair_file
from pipeline.errors import MissingArtifact
from pipeline.params import Params
from stages.validate.chunks import write_measure_chunks
from stages.validate.example_text import add_example_text
from stages.validate.gx_runtime import GxBatch, run_checkpoints
from stages.validate.merge import summarise
from stages.validate.report import report_outcome, stage_metrics
from stages.validate.suite import heldout_expectations, train_chunk_batch


def clean_splits(paths: Paths) -> dict[str, Path]:
    """The clean stage's split files by split name (train first), each checked to be a readable pair file."""
    splits = splits_in(paths.clean)
    if "train" not in splits:
        raise MissingArtifact(paths.split_file(paths.clean, "train"), "clean")
    inputs = {split: paths.split_file(paths.clean, split) for split in splits}
    for path in inputs.values():
        open_pair_file(path)
    return inputs


def run(params: Params, paths: Paths) -> dict[str, Any]:
    start = time.perf_counter()
    inputs = clean_splits(paths)
    rows = {split: count_rows(path) for split, path in inputs.items()}
    heldout = [split for split in inputs if split != "train"]

    report_dir = paths.validation_report
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    # The measures of the train split live only for this run, beside the report (not in /tmp, which may be a
    # small in-memory filesystem).
    with tempfile.TemporaryDirectory(prefix=".validate-", dir=report_dir.parent) as work_dir:
        chunks, language_sample_rows = write_measure_chunks(inputs["train"], Path(work_dir), params)
        batches = [
            train_chunk_batch(params, chunk, rows["train"], inputs["train"], language_sample_rows) for chunk in chunks
        ]
        batches += [GxBatch(split, inputs[split], heldout_expectations()) for split in heldout]
        with atomic_path(report_dir) as site_dir:
            results = run_checkpoints(batches, site_dir)

    results_by_split = {
        "train": results[: len(chunks)],
        **{split: [result] for split, result in zip(heldout, results[len(chunks) :], strict=True)},
    }
    # The chunks' row counts are merged into the split's, checked against validate.min_rows.
    min_rows = {"train": params.validate_.min_rows}
    per_split = {split: summarise(rows[split], results_by_split[split], min_rows.get(split)) for split in inputs}
    add_example_text(inputs["train"], per_split["train"])
    per_split["train"]["language_sample_rows"] = language_sample_rows
    metrics = stage_metrics(per_split)
    write_json(paths.metrics("validation"), metrics)
    report_outcome(metrics, time.perf_counter() - start, report_dir / "index.html", paths.metrics("validation"))
    return {k: v for k, v in metrics.items() if k != "splits"}


__all__ = ["run"]
