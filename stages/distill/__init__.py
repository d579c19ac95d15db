"""distill: the teacher translates every training source, and the translations become the student's corpus.

Sequence-level knowledge distillation (Kim & Rush 2016), as mozilla/translations trains its students: the teacher
(this run's `models/export`, or the export directory `distill.teacher` names) translates the cleaned training
sources of every direction with beam search on the project's own runtime (pipeline/runtime/translate.py: ONNX
Runtime, batched, `distill.threads` batches at once), and the student trains on (source, teacher's translation).

    python -m stages.distill          # reads models/export (or distill.teacher), data/clean, data/raw

    data/student/raw/
      train.parquet         one row per training source: the teacher's translation as tgt, and, for a seeded
                            `distill.original_ratio` share of them, the original pair too
      valid.parquet, ...    the run's own raw valid and test splits (hard links): the student is scored on the
                            teacher's references
      manifest.json         the run's manifest, with the teacher, its runtime and the rows per direction
    metrics/student/distill.json    sentences translated per direction, seconds and sentences/s

Each row's `origin` keeps where it came from: `teacher <digest>: <origin of the source>` or `reference: <origin>`.
Nothing is filtered here: the student_clean stage cleans this corpus like any raw corpus, so a translation the
teacher left empty (reason `empty`) or one failing a filter is recorded in data/student/clean/rejected.parquet.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, link_or_copy, read_json, splits_in, write_json
from pipeline.corpus import PAIR_SCHEMA, direction_column, open_pair_file
from pipeline.errors import MissingArtifact
from pipeline.params import DistillParams, Params
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import Direction, Directions

log = logging.getLogger("mtpipe.distill")

# Sources handed to the translator per call: large enough for full token batches on every thread, small enough
# for a progress line every few seconds.
CHUNK = 4096


def teacher_dir(params: Params, paths: Paths) -> Path:
    return Path(params.distill.teacher) if params.distill.teacher else paths.export


def teacher_digest(directory: Path, graphs: dict[str, str]) -> str:
    """The first 12 hex digits of the sha256 of the teacher's graphs: which model translated a row."""
    digest = hashlib.sha256()
    for name in sorted(graphs.values()):
        with open(directory / name, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def load_teacher(params: Params, paths: Paths, directions: Directions) -> Any:
    """The teacher's Translator, checked to translate every direction; a PipelineError naming distill.teacher."""
    from pipeline.runtime.translate import Translator

    directory = teacher_dir(params, paths)
    if not (directory / "export.json").is_file():
        if params.distill.teacher is None:
            raise MissingArtifact(directory / "export.json", "export")
        raise PipelineError(f"distill.teacher {directory}: no export.json there; name a models/export directory")
    threads = (os.cpu_count() or 1) if params.distill.threads == "auto" else int(params.distill.threads)
    teacher = Translator(directory, int8=params.distill.runtime == "onnx_int8", threads=threads)
    missing = [d for d in directions.names if d not in teacher.directions.names]
    if missing:
        raise PipelineError(f"distill.teacher {directory} does not translate {', '.join(missing)} (it translates "
                            f"{', '.join(teacher.directions.names)}); data.directions needs every one")
    return teacher


def reference_rows(count: int, cfg: DistillParams, direction_number: int) -> np.ndarray:
    """Which of a direction's `count` pairs also join the corpus with their original reference: a seeded
    `original_ratio` share, in row order."""
    keep = round(cfg.original_ratio * count)
    rng = np.random.default_rng([cfg.seed, direction_number])
    return np.sort(rng.choice(count, size=keep, replace=False)) if keep else np.zeros(0, dtype=np.int64)


def translate_direction(teacher: Any, direction: Direction, sources: list[str], beam: int) -> list[str]:
    out: list[str] = []
    start = time.perf_counter()
    for first in range(0, len(sources), CHUNK):
        out += teacher.translate(sources[first:first + CHUNK], beam=beam, tgt=direction.tgt, src=direction.src)
        done = len(out)
        log.info("%s: %d of %d sources translated (%.1f sentences/s)", direction, done, len(sources),
                 done / max(time.perf_counter() - start, 1e-9))
    return out


def distilled_table(table: pa.Table, hyps: list[str], reference_rows: np.ndarray, digest: str) -> pa.Table:
    """One direction's training rows: the teacher's translations, then the chosen original pairs."""
    origins = table.column("origin").to_pylist()
    distilled = table.set_column(table.schema.get_field_index("tgt"), "tgt", pa.array(hyps, pa.string()))
    distilled = distilled.set_column(distilled.schema.get_field_index("origin"), "origin",
                                     pa.array([f"teacher {digest}: {o}" for o in origins], pa.string()))
    originals = table.take(pa.array(reference_rows, pa.int64()))
    originals = originals.set_column(originals.schema.get_field_index("origin"), "origin",
                                     pa.array([f"reference: {origins[i]}" for i in reference_rows.tolist()],
                                              pa.string()))
    return pa.concat_tables([distilled, originals])


def run(params: Params, paths: Paths) -> dict[str, Any]:
    student = paths.student()
    train_file = paths.split_file(paths.clean, "train")
    for path, stage in ((train_file, "clean"), (paths.raw / "manifest.json", "download")):
        if not path.is_file():
            raise MissingArtifact(path, stage)
    directions, cfg = params.data.directions, params.distill
    teacher = load_teacher(params, paths, directions)
    graphs = dict(teacher.manifest.onnx_graphs(cfg.runtime == "onnx_int8"))
    digest = teacher_digest(teacher.model_dir, graphs)
    table = open_pair_file(train_file).read(columns=PAIR_SCHEMA.names)
    labels = np.array(direction_column(table).to_pylist(), dtype=object)
    per_direction: dict[str, Any] = {}
    parts: list[pa.Table] = []
    start = time.perf_counter()
    for number, direction in enumerate(directions.directions):
        rows = table.filter(pa.array(labels == str(direction)))
        began = time.perf_counter()
        hyps = translate_direction(teacher, direction, rows.column("src").to_pylist(), cfg.beam)
        seconds = time.perf_counter() - began
        references = reference_rows(len(rows), cfg, number)
        parts.append(distilled_table(rows, hyps, references, digest))
        per_direction[str(direction)] = {
            "sources": len(rows), "translated": len(hyps), "empty": sum(1 for h in hyps if not h.strip()),
            "references": len(references), "seconds": round(seconds, 1),
            "sentences_per_s": round(len(hyps) / max(seconds, 1e-9), 1)}
    seconds = time.perf_counter() - start
    sources = sum(d["sources"] for d in per_direction.values())
    # This run's export by its path in the project (the same on every machine); another by the path given.
    named = params.distill.teacher or paths.export.relative_to(paths.root).as_posix()
    teacher_record = {"export": named, "digest": digest, "runtime": cfg.runtime,
                      "graphs": graphs, "beam": cfg.beam, "threads": teacher.threads}
    with atomic_path(student.raw) as out:
        out.mkdir()
        pq.write_table(pa.concat_tables(parts).cast(PAIR_SCHEMA), out / "train.parquet")
        for split in splits_in(paths.raw):
            if split != "train":
                link_or_copy(paths.split_file(paths.raw, split), out / f"{split}.parquet")
        manifest = read_json(paths.raw / "manifest.json")
        manifest["splits"]["train"] = sum(len(p) for p in parts)
        manifest["rows_per_direction"]["train"] = {d: f["translated"] + f["references"]
                                                   for d, f in per_direction.items()}
        # No timings here: the same teacher and sources give the same data/student/raw, so nothing after it reruns.
        counts = {d: {k: v for k, v in f.items() if k not in ("seconds", "sentences_per_s")}
                  for d, f in per_direction.items()}
        manifest["distillation"] = {"teacher": {k: v for k, v in teacher_record.items() if k != "threads"},
                                    "original_ratio": cfg.original_ratio, "seed": cfg.seed, "directions": counts}
        write_json(out / "manifest.json", manifest)
    metrics = {"teacher": teacher_record, "sources": sources, "seconds": round(seconds, 1),
               "sentences_per_s": round(sources / max(seconds, 1e-9), 1), "directions": per_direction}
    write_json(student.metrics("distill"), metrics)
    log.info("the teacher translated %d training sources in %.0f s (%.1f sentences/s, beam %d, %s, %d threads)",
             sources, seconds, metrics["sentences_per_s"], cfg.beam, cfg.runtime, teacher.threads)
    return {"sources": sources, "sentences_per_s": metrics["sentences_per_s"]}


def run_or_note(params: Params, paths: Paths) -> dict[str, Any]:
    """The stage's command: the distillation, or with distill.enabled false a note in each of its outputs."""
    from pipeline.stage import write_disabled

    return run(params, paths) if params.distill.enabled else write_disabled(paths.student(), "distill")
