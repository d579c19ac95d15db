"""validate: check the cleaned splits with a Great Expectations suite before anything is trained on them.

The clean stage filters the training split and normalises every split; this stage checks that its output holds
what the rest of the pipeline assumes, so a bug or a changed threshold upstream stops the DAG here instead of
surfacing later as a bad model. The clean stage's thresholds (`params.clean`) are the bounds.

Each split is checked per direction: the rows whose src_lang and tgt_lang say en-de are one group, checked
against the scripts and language of en and de, and reported as a validation result of their own ("train-en-de");
validate.min_rows and the language check apply to each direction; a row of a direction data.directions does not
list fails. The whole training split is validated, every row, in memory that does not grow with the corpus:
- directions.py: a split's rows grouped by direction, streamed, and which groups each split must have.
- measures.py: the per-row measures GX checks instead of the text (direction, lengths, ratio, copies, repeats,
  shares, languages); language is detected on a seeded sample of `validate.language_sample` rows per direction,
  since a full pass would cost as much as the clean stage's optional language filter; every other expectation
  sees every row.
- chunks.py: each direction's training rows streamed into files of those measures, one per `validate.chunk_rows`.
- heldout.py: each direction's rows of a held-out split, as a file of its own.
- suite.py: the expectations, built from params and the direction, each with `meta={"critical": bool}`.
- gx_runtime.py: GX itself, one checkpoint per chunk (and per held-out split and direction), each page added to
  one Data Docs site in `reports/validation/`.
- offline_docs.py: that site made to load nothing from another host (the web assets of `assets/web` copied
  beside it, GX's logo and favicon links pointed at the site's own files).
- merge.py: a direction's chunks' results merged into one summary of its rows in the split.
- example_text.py: the text of failed expectations' example rows, looked up in the split by direction, origin and
  line.
- report.py: `metrics/validation.json` (totals, per direction, per split), the log, and `ValidationFailed` naming
  each failing direction when a critical expectation failed; the Data Docs and the metrics file are written
  first, so the report is there to inspect.

Importing this package imports neither Great Expectations nor pandas: importing GX alone takes seconds.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import open_pair_file
from pipeline.errors import MissingArtifact
from pipeline.params import Params
from pipeline.runtime.languages import Direction
from stages.validate.chunks import DirectionChunks, write_measure_chunks
from stages.validate.directions import count_by_direction, directions_to_check, listed_directions
from stages.validate.example_text import add_example_text
from stages.validate.gx_runtime import GxBatch, run_checkpoints
from stages.validate.heldout import write_direction_files
from stages.validate.merge import summarise
from stages.validate.report import report_outcome, stage_metrics
from stages.validate.suite import heldout_batch, train_chunk_batch

Group = tuple[str, Direction]  # (split, direction)


def clean_splits(paths: Paths) -> dict[str, Path]:
    """The clean stage's split files by split name (train first), each checked to be a readable pair file."""
    splits = splits_in(paths.clean)
    if "train" not in splits:
        raise MissingArtifact(paths.split_file(paths.clean, "train"), "clean")
    inputs = {split: paths.split_file(paths.clean, split) for split in splits}
    for path in inputs.values():
        open_pair_file(path)
    return inputs


def gx_batches(
    params: Params, inputs: dict[str, Path], groups: dict[str, dict[Direction, int]], work_dir: Path
) -> tuple[list[tuple[Group, GxBatch]], list[DirectionChunks]]:
    """Every GX batch, each with its (split, direction): the train split's chunks, then each held-out split's
    direction files, written to `work_dir`; and the train split's chunks by direction."""
    train = write_measure_chunks(inputs["train"], work_dir, params, groups["train"])
    batches = [
        (("train", group.direction), train_chunk_batch(params, group, chunk, inputs["train"]))
        for group in train
        for chunk in group.chunks
    ]
    for split in (s for s in inputs if s != "train"):
        files = write_direction_files(inputs[split], work_dir, split, list(groups[split]))
        batches += [((split, d), heldout_batch(params, split, d, path, inputs[split])) for d, path in files.items()]
    return batches, train


def summaries(
    params: Params, keys: list[Group], results: list[Any], groups: dict[str, dict[Direction, int]]
) -> dict[str, dict[str, dict[str, Any]]]:
    """split -> direction -> the summary of that direction's rows in the split (its chunks' results merged); a
    listed direction's training rows are counted against validate.min_rows."""
    by_group: dict[Group, list[Any]] = {}
    for key, result in zip(keys, results, strict=True):
        by_group.setdefault(key, []).append(result)
    per_group: dict[str, dict[str, dict[str, Any]]] = {split: {} for split in groups}
    for (split, direction), group_results in by_group.items():
        min_rows = params.validate_.min_rows if split == "train" else None
        per_group[split][str(direction)] = summarise(groups[split][direction], group_results, min_rows)
    return per_group


def run(params: Params, paths: Paths) -> dict[str, Any]:
    start = time.perf_counter()
    inputs = clean_splits(paths)
    listed = listed_directions(params)
    groups = {}
    for split, path in inputs.items():
        counts = count_by_direction(path)
        groups[split] = {d: counts.get(d, 0) for d in directions_to_check(split, counts, listed)}

    report_dir = paths.validation_report
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    # The measures of the train split and the held-out direction files live only for this run, beside the report
    # (not in /tmp, which may be a small in-memory filesystem).
    with tempfile.TemporaryDirectory(prefix=".validate-", dir=report_dir.parent) as work_dir:
        batches, train = gx_batches(params, inputs, groups, Path(work_dir))
        with atomic_path(report_dir) as site_dir:
            results = run_checkpoints([batch for _, batch in batches], site_dir)

    per_group = summaries(params, [key for key, _ in batches], results, groups)
    for group in train:
        per_group["train"][str(group.direction)]["language_sample_rows"] = group.language_sample_rows
    add_example_text(inputs["train"], per_group["train"])
    order = list(dict.fromkeys(str(d) for split_groups in groups.values() for d in split_groups))
    metrics = stage_metrics(per_group, order)
    write_json(paths.metrics("validation"), metrics)
    report_outcome(metrics, time.perf_counter() - start, report_dir / "index.html", paths.metrics("validation"))
    return {k: v for k, v in metrics.items() if k != "splits"}


__all__ = ["run"]
