"""download: bring the parallel corpus into `data/raw/<split>.parquet` (PAIR_SCHEMA: src, tgt, src_lang, tgt_lang,
origin, line), every direction of `data.directions` in one file per split.

Sources (`data.source`): `sample`, the corpus the project ships in `assets/sample/` (English-German, offline);
`files`, local files named by `data.files.<split>` (inputs.py says which directions each entry serves, and checks
every file before anything is read); `hub`, a Hugging Face dataset that holds translations, by hub id or local
directory (hub.py), with `wmt14` its preset (train, newstest2013 as valid, newstest2014 as test). Besides them,
every sacreBLEU test set `evaluate.sacrebleu_test_sets` names becomes a test split, fetched through sacreBLEU's
downloader and cache (pipeline/sacrebleu_sets.py), checked with the rest before anything is written. A split's
rows come direction by direction in data.directions order. Every row carries its languages, its `origin` (the
input file as written in params.yaml, the dataset, config and split, or sacreBLEU's file) and its 1-based `line`
there. `data.max_train_pairs` caps each direction's training pairs. Rows are streamed into Parquet in row groups;
nothing is filtered here: bad input is an error naming the file, line and direction. `manifest.json` records the
source, the directions, the dataset and the commit read, rows per split and per direction, each direction's
subsample and the sha256 of every input file.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, write_json
from pipeline.corpus import BATCH_ROWS, PAIR_SCHEMA
from pipeline.params import DataParams, Params
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import Direction
from pipeline.sacrebleu_sets import TestSetText, check_test_sets, fetch, sha256_of, split_name
from stages.download.hub import HubDataset
from stages.download.inputs import Input, Pair, resolve_inputs, split_pairs

log = logging.getLogger("mtpipe.download")

# One direction's pairs of a split, as they are written.
Stream = tuple[Direction, Iterable[Pair]]


@dataclass
class Downloaded:
    """What the stage wrote: what manifest.json and the metrics report."""

    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> direction -> rows
    inputs: dict[str, str] = field(default_factory=dict)  # input file -> sha256
    subsample: dict[str, dict[str, Any]] = field(default_factory=dict)  # direction -> how its train was capped
    dataset: dict[str, Any] = field(default_factory=dict)  # hub: the dataset, the commit and configs read
    sacrebleu: dict[str, Any] = field(default_factory=dict)  # test set -> its split and files


# --- subsampling ------------------------------------------------------------------------------------------


def spread(pairs: Iterable[Pair], keep: int, total: int) -> Iterator[Pair]:
    """`keep` of `total` pairs evenly spaced (row i is kept when floor((i+1)k/n) > floor(ik/n)): deterministic,
    in one pass and O(1) memory, and every part of a concatenated corpus contributes its share."""
    for i, pair in enumerate(pairs):
        if (i + 1) * keep // total > i * keep // total:
            yield pair


def subsampled(
    pairs: Iterable[Pair], data: DataParams, total: int | None, direction: Direction, notes: dict[str, Any]
) -> Iterable[Pair]:
    """At most data.max_train_pairs of one direction's training pairs (`total` of them, when known); how they were
    taken goes into `notes[direction]` for the manifest. Without a cap, `pairs` as they are."""
    cap = data.max_train_pairs
    if cap is None:
        return pairs
    method = data.subsample if total is not None else "head"
    if data.subsample == "spread" and total is None:
        log.warning("the size of %s's training pairs is unknown, so max_train_pairs takes the first %d", direction, cap)
    notes[str(direction)] = {"max_train_pairs": cap, "method": method, "from_pairs": total}
    if method == "spread" and total is not None and total > cap:
        return spread(pairs, cap, total)
    return islice(pairs, cap)


# --- writing --------------------------------------------------------------------------------------------------


def write_split(streams: Iterable[Stream], out: Path) -> dict[str, int]:
    """Stream each direction's pairs into one Parquet file, direction after direction, in batches of at most
    BATCH_ROWS pairs; returns the rows per direction."""
    from tqdm import tqdm

    rows: dict[str, int] = {}
    # The total is unknown while streaming: the bar counts. disable=None: on a terminal only, not in log files.
    progress = tqdm(desc=f"download {out.stem}", unit="pairs", unit_scale=True, mininterval=2, disable=None)
    with pq.ParquetWriter(out, PAIR_SCHEMA) as writer, progress:
        for direction, pairs in streams:
            rows[str(direction)] = 0
            pairs = iter(pairs)
            while chunk := list(islice(pairs, BATCH_ROWS)):
                writer.write_batch(_record_batch(chunk, direction))
                rows[str(direction)] += len(chunk)
                progress.update(len(chunk))
    return rows


def _record_batch(chunk: list[Pair], direction: Direction) -> pa.RecordBatch:
    src, tgt, origin, line = zip(*chunk, strict=True)
    columns = {
        "src": src,
        "tgt": tgt,
        "src_lang": [direction.src] * len(chunk),
        "tgt_lang": [direction.tgt] * len(chunk),
        "origin": origin,
        "line": line,
    }
    return pa.RecordBatch.from_pydict(columns, schema=PAIR_SCHEMA)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _counted(rows: dict[str, int]) -> str:
    """ "12 pairs (en-de 6, en-fr 6)" for the log."""
    return f"{sum(rows.values())} pairs ({', '.join(f'{d} {n}' for d, n in rows.items())})"


# --- a hub dataset ------------------------------------------------------------------------------------------


def download_hub(params: Params, root: Path, out: Path) -> Downloaded:
    """Every split of the hub dataset, each direction from its configuration; everything each direction reads is
    checked to exist before the first row is written."""
    hub = params.data.hub_dataset()
    assert hub is not None  # params: source hub has data.hub; a preset has its own
    dataset = HubDataset(hub, root)
    configs = dataset.configs()
    sources = [dataset.direction_source(d, configs) for d in params.data.directions.directions]
    done = Downloaded(dataset={"dataset": hub.path, "dataset_is_local": dataset.local, "revision": dataset.revision,
                               "configs": {str(s.direction): s.config for s in sources},
                               "dataset_splits": dict(hub.splits)})
    for split in hub.splits:
        streams: list[Stream] = []
        for source in sources:
            pairs: Iterable[Pair] = dataset.pairs(source, split)
            if split == "train":
                pairs = subsampled(pairs, params.data, source.splits[split][1], source.direction, done.subsample)
            streams.append((source.direction, pairs))
        done.rows[split] = write_split(streams, out / f"{split}.parquet")
        log.info("%s: %s", split, _counted(done.rows[split]))
    for path in dict.fromkeys(f for source in sources for f in source.files):
        done.inputs[path] = sha256(Path(path))
    return done


# --- sacreBLEU's test sets ------------------------------------------------------------------------------------


def fetch_sacrebleu_test_sets(params: Params) -> dict[str, dict[Direction, TestSetText]]:
    """Every set of evaluate.sacrebleu_test_sets for every direction, before the (much larger) data is read, so a
    set that cannot be fetched stops the stage before any work."""
    return {name: {d: fetch(name, d) for d in params.data.directions.directions}
            for name in params.evaluate.sacrebleu_test_sets}


def write_sacrebleu_test_sets(test_sets: dict[str, dict[Direction, TestSetText]], out: Path, done: Downloaded) -> None:
    """One test split per sacreBLEU set, every direction in it, as sacreBLEU gives it."""
    for name, texts in test_sets.items():
        streams = [(d, _test_set_pairs(text.sources, text.references, text.origin)) for d, text in texts.items()]
        split = split_name(name)
        done.rows[split] = write_split(streams, out / f"{split}.parquet")
        done.sacrebleu[name] = {"split": split,
                                "files": {str(d): {f: sha256_of(p) for f, p in text.files.items()}
                                          for d, text in texts.items()}}
        log.info("%s (sacreBLEU %s): %s", split, name, _counted(done.rows[split]))


def _test_set_pairs(sources: list[str], references: list[str], origin: str) -> Iterator[Pair]:
    for n, (src, ref) in enumerate(zip(sources, references, strict=True), start=1):
        yield src, ref, origin, n


# --- files and the sample -------------------------------------------------------------------------------------


def _files_stream(
    split: str, inputs: list[Input], data: DataParams, direction: Direction, notes: dict[str, Any]
) -> Stream:
    pairs = split_pairs(inputs)
    if split == "train" and data.max_train_pairs is not None:
        # Counting lines reads the files once more; only spread needs the total.
        total = sum(one.count() for one in inputs) if data.subsample == "spread" else None
        pairs = subsampled(pairs, data, total, direction, notes)
    return direction, pairs


def copy_files(params: Params, root: Path, out: Path) -> Downloaded:
    """The sample or data.files into Parquet, split by split; a test split holds the directions it has inputs for."""
    done = Downloaded()
    for split, by_direction in resolve_inputs(params, root).items():
        streams = [
            _files_stream(split, inputs, params.data, d, done.subsample) for d, inputs in by_direction.items() if inputs
        ]
        done.rows[split] = write_split(streams, out / f"{split}.parquet")
        for path in (path for inputs in by_direction.values() for one in inputs for path in one.files):
            if str(path) not in done.inputs:  # a language's file of a {pattern} serves several directions
                done.inputs[str(path)] = sha256(path)
        log.info("%s: %s from %d input(s)", split, _counted(done.rows[split]), sum(map(len, by_direction.values())))
    return done


# --- the stage ------------------------------------------------------------------------------------------------


def run(params: Params, paths: Paths) -> dict[str, Any]:
    data = params.data
    check_test_sets(params.evaluate.sacrebleu_test_sets, data.directions, data.split_names())
    test_sets = fetch_sacrebleu_test_sets(params)
    with atomic_path(paths.raw) as out:
        out.mkdir()
        done = download_hub(params, paths.root, out) if data.hub_dataset() else copy_files(params, paths.root, out)
        write_sacrebleu_test_sets(test_sets, out, done)
        _check_every_direction_has_rows(done, data)
        write_json(out / "manifest.json", _manifest(data, done))
    metrics: dict[str, Any] = {"source": data.source}
    metrics |= {f"{split}_pairs": sum(rows.values()) for split, rows in done.rows.items()}
    if len(data.directions.names) > 1:
        metrics |= {f"train_pairs_{direction}": n for direction, n in done.rows["train"].items()}
    return metrics


def _check_every_direction_has_rows(done: Downloaded, data: DataParams) -> None:
    if empty := [split for split, rows in done.rows.items() if not sum(rows.values())]:
        raise PipelineError(f"the {data.source} source gave no pairs for split(s) {empty}")
    for split in ("train", "valid"):
        if empty := [d for d in data.directions.names if not done.rows[split].get(d)]:
            raise PipelineError(f"the {data.source} source gave no pairs of direction(s) {empty} for split {split}")


def _manifest(data: DataParams, done: Downloaded) -> dict[str, Any]:
    manifest = {"source": data.source, "directions": data.directions.names, **done.dataset}
    manifest |= {
        "splits": {split: sum(rows.values()) for split, rows in done.rows.items()},
        "rows_per_direction": done.rows,
        "inputs": done.inputs,
    }
    manifest |= {"sacrebleu_test_sets": done.sacrebleu} if done.sacrebleu else {}
    return manifest | ({"subsample": done.subsample} if done.subsample else {})
