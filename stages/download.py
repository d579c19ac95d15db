"""download: bring the parallel corpus into `data/raw/<split>.parquet` (PAIR_SCHEMA: src, tgt, src_lang, tgt_lang,
origin, line), every direction of `data.directions` in one file per split.

Three sources (`data.source`):
- `sample`: the corpus the project ships in `assets/sample/` (train/valid/test, English-German), offline, for
            en-de and/or de-en;
- `files`:  `data.files.<split>` is one entry or a list of entries: `{src, tgt, direction}` (two aligned files),
            `{tsv, columns}` (two tab-separated columns), `{dir, prefix}` (Moses-style NAME.<lang> files) or
            `{pattern}` (one line-aligned file per language); stages/download_inputs.py says which directions each
            serves, and checks every file and every direction's inputs before anything is read;
- `wmt14`:  WMT14 through Hugging Face `datasets` (train, newstest2013 as valid, newstest2014 as test), each
            direction from its config ({x}-en for en-x and x-en) at one resolved revision, streamed so memory
            stays bounded; with no route to the hub it fails at once and says what to do.
A split's rows come direction by direction in data.directions order (within a direction, entries in order). Every
row carries its languages, its `origin` (the input file as written in params.yaml, or the dataset, config and
split) and its 1-based `line` there. `data.max_train_pairs` caps each direction's training pairs. Rows are streamed
into Parquet in row groups; nothing is filtered here: bad input is an error naming the file, line and direction.
`manifest.json` records the source, the directions, the revision when known, rows per split and per direction,
each direction's subsample and the sha256 of every input file.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, write_json
from pipeline.corpus import BATCH_ROWS, PAIR_SCHEMA
from pipeline.errors import HubUnreachable, PipelineError
from pipeline.languages import Direction
from pipeline.params import DataParams, Params
from stages.download_inputs import Input, Pair, resolve_inputs, split_pairs

log = logging.getLogger("mtpipe.download")

# One direction's pairs of a split, as they are written.
Stream = tuple[Direction, Iterable[Pair]]

WMT14_DATASET = "wmt/wmt14"
WMT14_SPLITS = {"train": "train", "valid": "validation", "newstest2014": "test"}


@dataclass
class Downloaded:
    """What the stage wrote: what manifest.json and the metrics report."""

    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> direction -> rows
    inputs: dict[str, str] = field(default_factory=dict)  # input file -> sha256
    subsample: dict[str, dict[str, Any]] = field(default_factory=dict)  # direction -> how its train was capped
    dataset: dict[str, Any] = field(default_factory=dict)  # wmt14: the dataset and the revision read


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


# --- WMT14 ----------------------------------------------------------------------------------------------------


def _check_hub_reachable(timeout: float = 5.0) -> None:
    """Fail at once, not after datasets' retry loop, when the hub cannot be reached."""
    hint = (
        "Hugging Face hub is unreachable{why}, so WMT14 cannot be downloaded. Download it where you have network "
        "access, or point data.source: files at local parallel files (data.files.<split>: {{src, tgt}}, {{tsv}}, "
        "{{dir}} or {{pattern}}, plain or .gz)."
    )
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            raise HubUnreachable(hint.format(why=f" ({var} is set)"))
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    url = f"{constants.ENDPOINT}/api/datasets/{WMT14_DATASET}"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except (urllib.error.URLError, OSError) as err:
        if isinstance(err, urllib.error.HTTPError) and err.code < 500:
            return  # the hub answered (e.g. 401/404 from a gated endpoint): reachable
        raise HubUnreachable(hint.format(why=f" ({url}: {getattr(err, 'reason', err)})")) from None


def _resolve_revision(revision: str | None) -> str | None:
    """The commit of the dataset repository that `revision` (null: the default branch) points to now, so every
    split is read from the same commit and the manifest can name it."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return HfApi().dataset_info(WMT14_DATASET, revision=revision).sha or revision
    except HfHubHTTPError as err:
        raise PipelineError(f"{WMT14_DATASET}: cannot resolve revision {revision or 'main'!r}: {err}") from None


def _load_wmt14(config: str, split: str, revision: str | None) -> tuple[Iterable[dict[str, Any]], int | None]:
    """The streamed rows of one WMT14 split and its size when the dataset card states it."""
    from datasets import load_dataset

    dataset = load_dataset(WMT14_DATASET, config, split=split, streaming=True, revision=revision)
    splits = getattr(dataset.info, "splits", None) or {}
    info = splits.get(split) if hasattr(splits, "get") else None
    return dataset, getattr(info, "num_examples", None) or None


def wmt14_config(direction: Direction) -> str:
    """The WMT14 config that holds a direction: `x-en` for both en-x and x-en (params allows no other pair)."""
    return f"{direction.tgt if direction.src == 'en' else direction.src}-en"


def wmt14_split(direction: Direction, split: str, revision: str | None) -> tuple[Iterator[Pair], int | None]:
    """One direction's pairs of a WMT14 split, oriented as the direction says, and their number when known."""
    config = wmt14_config(direction)
    rows, total = _load_wmt14(config, WMT14_SPLITS[split], revision)
    origin = f"{WMT14_DATASET}:{config}:{WMT14_SPLITS[split]}"

    def pairs() -> Iterator[Pair]:
        for n, row in enumerate(rows, start=1):
            yield row["translation"][direction.src], row["translation"][direction.tgt], origin, n

    return pairs(), total


def download_wmt14(params: Params, out: Path) -> Downloaded:
    _check_hub_reachable()
    revision = _resolve_revision(params.data.revision)
    done = Downloaded(dataset={"dataset": WMT14_DATASET, "revision": revision})
    for split in WMT14_SPLITS:
        streams: list[Stream] = []
        for direction in params.data.pairs.directions:
            pairs, total = wmt14_split(direction, split, revision)
            if split == "train":
                pairs = subsampled(pairs, params.data, total, direction, done.subsample)
            streams.append((direction, pairs))
        done.rows[split] = write_split(streams, out / f"{split}.parquet")
        log.info("%s: %s", split, _counted(done.rows[split]))
    return done


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
    with atomic_path(paths.raw) as out:
        out.mkdir()
        done = download_wmt14(params, out) if data.source == "wmt14" else copy_files(params, paths.root, out)
        _check_every_direction_has_rows(done, data)
        write_json(out / "manifest.json", _manifest(data, done))
    metrics: dict[str, Any] = {"source": data.source}
    metrics |= {f"{split}_pairs": sum(rows.values()) for split, rows in done.rows.items()}
    if len(data.directions) > 1:
        metrics |= {f"train_pairs_{direction}": n for direction, n in done.rows["train"].items()}
    return metrics


def _check_every_direction_has_rows(done: Downloaded, data: DataParams) -> None:
    if empty := [split for split, rows in done.rows.items() if not sum(rows.values())]:
        raise PipelineError(f"the {data.source} source gave no pairs for split(s) {empty}")
    for split in ("train", "valid"):
        if empty := [d for d in data.directions if not done.rows[split].get(d)]:
            raise PipelineError(f"the {data.source} source gave no pairs of direction(s) {empty} for split {split}")


def _manifest(data: DataParams, done: Downloaded) -> dict[str, Any]:
    manifest = {"source": data.source, "directions": data.directions, **done.dataset}
    manifest |= {
        "splits": {split: sum(rows.values()) for split, rows in done.rows.items()},
        "rows_per_direction": done.rows,
        "inputs": done.inputs,
    }
    return manifest | ({"subsample": done.subsample} if done.subsample else {})


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "download")
