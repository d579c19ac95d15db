"""distill: the teacher translates every training source, and the translations become the student's corpus.

Sequence-level knowledge distillation (Kim & Rush 2016), as mozilla/translations trains its students: the teacher
(the export directory `distill.teacher` names: this run's `models/export` by default) translates the cleaned training
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, link_or_copy, read_json, splits_in, write_json
from pipeline.corpus import BATCH_ROWS, PAIR_SCHEMA, directions_of, open_pair_file
from pipeline.errors import MissingArtifact
from pipeline.params import DistillParams, Params
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import Direction, Directions

log = logging.getLogger("mtpipe.distill")

# Sources of one direction handed to the translator per call: large enough for full, length-sorted token batches on
# every thread, small enough for a progress line every few seconds and little memory.
CHUNK = 4096


def teacher_dir(params: Params, paths: Paths) -> Path:
    external = params.distill.external_teacher
    return Path(external) if external else paths.export


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
        if params.distill.external_teacher is None:
            raise MissingArtifact(directory / "export.json", "export")
        raise PipelineError(f"distill.teacher {directory}: no export.json there; name a models/export directory")
    threads = (os.cpu_count() or 1) if params.distill.threads == "auto" else int(params.distill.threads)
    # The teacher's best translations, over its whole vocabulary: a shortlist trades BLEU for speed, and the
    # corpus is translated once.
    teacher = Translator(directory, int8=params.distill.runtime == "onnx_int8", threads=threads, shortlist=False)
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


@dataclass
class DirectionRun:
    """One direction's progress through the training split: sources waiting for the teacher, how many came before
    them, and which of the direction's rows (by number) also keep their original reference."""

    direction: Direction
    references: np.ndarray
    pending: list[pa.Table] = field(default_factory=list)
    sources: int = 0
    empty: int = 0
    seconds: float = 0.0

    @property
    def pending_rows(self) -> int:
        return sum(len(t) for t in self.pending)

    def flush(self, teacher: Any, beam: int, digest: str, total: int) -> tuple[pa.Table, pa.Table]:
        """The waiting sources translated: (the distilled rows, the original pairs chosen among them)."""
        rows = pa.concat_tables(self.pending)
        self.pending = []
        began = time.perf_counter()
        hyps = teacher.translate(rows.column("src").to_pylist(), beam=beam, tgt=self.direction.tgt,
                                 src=self.direction.src)
        self.seconds += time.perf_counter() - began
        first, self.sources = self.sources, self.sources + len(rows)
        self.empty += sum(1 for h in hyps if not h.strip())
        chosen = self.references[(self.references >= first) & (self.references < self.sources)] - first
        log.info("%s: %d of %d sources translated (%.1f sentences/s)", self.direction, self.sources, total,
                 self.sources / max(self.seconds, 1e-9))
        return distilled_rows(rows, hyps, digest), original_rows(rows, chosen)

    def figures(self) -> dict[str, Any]:
        return {"sources": self.sources, "translated": self.sources, "empty": self.empty,
                "references": len(self.references), "seconds": round(self.seconds, 1),
                "sentences_per_s": round(self.sources / max(self.seconds, 1e-9), 1)}


def with_column(table: pa.Table, name: str, values: list[str]) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values, pa.string()))


def distilled_rows(rows: pa.Table, hyps: list[str], digest: str) -> pa.Table:
    """The rows with the teacher's translations as targets, each origin naming the teacher."""
    origins = [f"teacher {digest}: {o}" for o in rows.column("origin").to_pylist()]
    return with_column(with_column(rows, "tgt", hyps), "origin", origins)


def original_rows(rows: pa.Table, chosen: np.ndarray) -> pa.Table:
    originals = rows.take(pa.array(chosen, pa.int64()))
    return with_column(originals, "origin", [f"reference: {o}" for o in originals.column("origin").to_pylist()])


def direction_counts(train: pq.ParquetFile) -> Counter[str]:
    counts: Counter[str] = Counter()
    for batch in train.iter_batches(columns=["src_lang", "tgt_lang"], batch_size=BATCH_ROWS):
        counts.update(directions_of(batch))
    return counts


def distill_split(train: pq.ParquetFile, teacher: Any, directions: Directions, cfg: DistillParams, digest: str,
                  out: Path) -> dict[str, dict[str, Any]]:
    """Translate the training split into out/train.parquet: the teacher's rows as they come, CHUNK sources of a
    direction at a time, then the original pairs kept beside them. One pass, and memory holds a chunk per
    direction, never the corpus (a WMT-sized split has millions of pairs). Returns the figures per direction."""
    counts = direction_counts(train)
    runs = {str(d): DirectionRun(d, reference_rows(counts[str(d)], cfg, number))
            for number, d in enumerate(directions.directions)}
    originals_file = out / "originals.parquet"
    with pq.ParquetWriter(out / "train.parquet", PAIR_SCHEMA) as writer:
        with pq.ParquetWriter(originals_file, PAIR_SCHEMA) as originals:
            def flush(name: str) -> None:
                distilled, kept = runs[name].flush(teacher, cfg.beam, digest, counts[name])
                writer.write_table(distilled.cast(PAIR_SCHEMA))
                originals.write_table(kept.cast(PAIR_SCHEMA))

            for batch in train.iter_batches(columns=PAIR_SCHEMA.names, batch_size=CHUNK):
                rows = pa.Table.from_batches([batch])
                labels = np.array(directions_of(batch), dtype=object)
                for name, run in runs.items():
                    if (mine := labels == name).any():
                        run.pending.append(rows.filter(pa.array(mine)))
                    if run.pending_rows >= CHUNK:
                        flush(name)
            for name, run in runs.items():
                if run.pending_rows:
                    flush(name)
        for batch in pq.ParquetFile(originals_file).iter_batches(batch_size=BATCH_ROWS):
            writer.write_batch(batch)
    originals_file.unlink()
    return {name: run.figures() for name, run in runs.items()}


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
    start = time.perf_counter()
    with atomic_path(student.raw) as out:
        out.mkdir()
        per_direction = distill_split(open_pair_file(train_file), teacher, directions, cfg, digest, out)
        seconds = time.perf_counter() - start
        for split in splits_in(paths.raw):
            if split != "train":
                link_or_copy(paths.split_file(paths.raw, split), out / f"{split}.parquet")
        # This run's export by its path in the project (the same on every machine); another by the path given.
        named = params.distill.external_teacher or paths.export.relative_to(paths.root).as_posix()
        teacher_record = {"export": named, "digest": digest, "runtime": cfg.runtime,
                          "graphs": graphs, "beam": cfg.beam, "threads": teacher.threads}
        write_json(out / "manifest.json", distilled_manifest(read_json(paths.raw / "manifest.json"), per_direction,
                                                             teacher_record, cfg))
    sources = sum(d["sources"] for d in per_direction.values())
    metrics = {"teacher": teacher_record, "sources": sources, "seconds": round(seconds, 1),
               "sentences_per_s": round(sources / max(seconds, 1e-9), 1), "directions": per_direction}
    write_json(student.metrics("distill"), metrics)
    log.info("the teacher translated %d training sources in %.0f s (%.1f sentences/s, beam %d, %s, %d threads)",
             sources, seconds, metrics["sentences_per_s"], cfg.beam, cfg.runtime, teacher.threads)
    return {"sources": sources, "sentences_per_s": metrics["sentences_per_s"]}


def distilled_manifest(manifest: dict[str, Any], per_direction: dict[str, dict[str, Any]],
                       teacher_record: dict[str, Any], cfg: DistillParams) -> dict[str, Any]:
    """The run's raw manifest with the distilled training split's rows and where they came from."""
    rows = {d: f["translated"] + f["references"] for d, f in per_direction.items()}
    manifest["splits"]["train"] = sum(rows.values())
    manifest["rows_per_direction"]["train"] = rows
    # No timings or thread counts: the same teacher and sources give the same data/student/raw, so nothing after
    # it reruns.
    counts = {d: {k: v for k, v in f.items() if k not in ("seconds", "sentences_per_s")}
              for d, f in per_direction.items()}
    manifest["distillation"] = {"teacher": {k: v for k, v in teacher_record.items() if k != "threads"},
                                "original_ratio": cfg.original_ratio, "seed": cfg.seed, "directions": counts}
    return manifest


def run_or_note(params: Params, paths: Paths) -> dict[str, Any]:
    """The stage's command: the distillation, or with distill.enabled false a note in each of its outputs."""
    from pipeline.stage import write_disabled

    return run(params, paths) if params.distill.enabled else write_disabled(paths.student(), "distill")
