"""download: bring the parallel corpus into `data/raw/<split>.parquet` (columns src, tgt, origin, line).

Three sources (`data.source`):
- `sample`: the corpus the project ships in `assets/sample/` (train/valid/test, en-de), offline;
- `files`:  `data.files.<split>` is one entry or a list of entries, concatenated in order; an entry is
            `{src, tgt}` (two aligned files, one sentence a line), `{tsv}` (one file, two tab-separated columns)
            or `{dir, prefix}` (Moses-style NAME.<src_lang> / NAME.<tgt_lang> files in a directory). Every file
            may be plain or .gz, UTF-8;
- `wmt14`:  WMT14 through Hugging Face `datasets` (train, newstest2013 as valid, newstest2014 as test) at one
            resolved revision, streamed so memory stays bounded; with no route to the hub it fails at once and
            says what to do.
Every row keeps its `origin` (the input file as written in params.yaml, or the dataset and split) and its
1-based `line` there. Rows are streamed into Parquet in row groups; nothing is filtered here: bad input is an
error naming the file and line. `manifest.json` records the source, the revision when known, rows per split,
the subsample and the sha256 of every input file.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice, zip_longest
from pathlib import Path, PurePath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.artifacts import SAMPLE_DIR, Paths, atomic_path, write_json
from pipeline.corpus import BATCH_ROWS, PAIR_SCHEMA
from pipeline.errors import CorpusMisaligned, HubUnreachable, InputFileError, PipelineError
from pipeline.params import MosesDir, Params, SplitFiles, TsvFile

log = logging.getLogger("mtpipe.download")

Pair = tuple[str, str, str, int]  # src, tgt, origin, line (1-based)

WMT14_DATASET = "wmt/wmt14"
WMT14_SPLITS = {"train": "train", "valid": "validation", "newstest2014": "test"}
# NAME.<lang> or NAME.<lang>.gz in a Moses-style directory.
MOSES_FILE = re.compile(r"^(?P<name>.+?)\.(?P<lang>[a-z]{2,3})(?P<gz>\.gz)?$")


# --- reading files ------------------------------------------------------------------------------------------


def _open_binary(path: Path):
    if not path.is_file():
        raise InputFileError(path, "directory, not a file" if path.is_dir() else "file not found")
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_lines(path: Path) -> Iterator[str]:
    """Lines of a plain or gzip UTF-8 file without line ends; CRLF and a leading BOM are handled.

    Invalid UTF-8 or a truncated .gz raise InputFileError naming the file and line.
    """
    number = 0
    try:
        with _open_binary(path) as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise InputFileError(path, f"not valid UTF-8 at byte {err.start} ({err.reason})", number) from None
                if number == 1:
                    line = line.removeprefix("\ufeff")
                yield line.rstrip("\r\n")
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise InputFileError(path, f"corrupt or truncated gzip after {number} lines ({err})") from None


def count_lines(path: Path) -> int:
    """Lines of a plain or gzip file as read_lines yields them (a last line without a line end counts), fast."""
    lines, last = 0, b"\n"
    try:
        with _open_binary(path) as f:
            while block := f.read(1 << 22):
                lines += block.count(b"\n")
                last = block[-1:]
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise InputFileError(path, f"corrupt or truncated gzip after {lines} lines ({err})") from None
    return lines + (last != b"\n")


def read_parallel(src_path: Path, tgt_path: Path, origin: str | None = None) -> Iterator[Pair]:
    """Pairs of two aligned files; a length mismatch raises CorpusMisaligned with both paths and counts."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    origin = origin or src_path.name
    n = 0
    # Not zip(): it consumes (and loses) the source's extra line before noticing the target has ended.
    for n, (src, tgt) in enumerate(zip_longest(src_lines, tgt_lines), start=1):
        if src is None or tgt is None:
            extra_src, extra_tgt = sum(1 for _ in src_lines), sum(1 for _ in tgt_lines)
            lines_src = n - 1 + (src is not None) + extra_src
            lines_tgt = n - 1 + (tgt is not None) + extra_tgt
            raise CorpusMisaligned(src_path, tgt_path, lines_src, lines_tgt)
        yield src, tgt, origin, n


def read_tsv(path: Path, swap: bool = False, origin: str | None = None) -> Iterator[Pair]:
    """Pairs of a two-column TSV file (second column first when `swap`); a line without exactly one tab is an
    error naming the file and line: a third column or a missing one means the file is not what params.yaml says."""
    origin = origin or path.name
    for n, line in enumerate(read_lines(path), start=1):
        columns = line.split("\t")
        if len(columns) != 2:
            raise InputFileError(path, f"expected 2 tab-separated columns, found {len(columns)} ({_preview(line)})", n)
        first, second = columns
        yield (second, first, origin, n) if swap else (first, second, origin, n)


def _preview(line: str, width: int = 60) -> str:
    return repr(line if len(line) <= width else line[: width - 3] + "...")


# --- inputs: what data.files names, resolved to files ------------------------------------------------------


@dataclass
class Input:
    """One input of a split: the files it reads, how to read its pairs, and how to count them cheaply."""

    files: list[Path]
    describe: str  # for messages: the files, as the user named them
    read: Callable[[], Iterator[Pair]]
    count: Callable[[], int]


def _resolve(path: str, root: Path) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else root / p


def _aligned_input(src: Path, tgt: Path, src_origin: str) -> Input:
    return Input(
        files=[src, tgt],
        describe=f"{src} and {tgt}",
        read=lambda: read_parallel(src, tgt, src_origin),
        count=lambda: count_lines(src),
    )


def moses_pairs(directory: Path, prefix: str, src_lang: str, tgt_lang: str) -> list[tuple[str, Path, Path]]:
    """(NAME, NAME.<src_lang>, NAME.<tgt_lang>) for every NAME in `directory` starting with `prefix`, NAME order.

    A NAME with only one of the two languages is an error (a forgotten or misnamed file would otherwise drop a
    corpus silently), and so is a directory with no pair at all.
    """
    if not directory.is_dir():
        raise InputFileError(directory, "directory not found" if not directory.exists() else "not a directory")
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(directory.iterdir()):
        match = MOSES_FILE.match(path.name)
        if not path.is_file() or not match or not match["name"].startswith(prefix):
            continue
        if match["lang"] not in (src_lang, tgt_lang):
            continue
        sides = found.setdefault(match["name"], {})
        if match["lang"] in sides:
            raise InputFileError(directory, f"both {sides[match['lang']].name} and {path.name} exist: keep one")
        sides[match["lang"]] = path
    if not found:
        others = sorted(p.name for p in directory.iterdir())[:10]
        raise InputFileError(
            directory,
            f"no NAME.{src_lang} / NAME.{tgt_lang} files (plain or .gz)"
            + (f" whose NAME starts with {prefix!r}" if prefix else "")
            + f"; it has {others or 'nothing'}",
        )
    pairs = []
    for name, sides in sorted(found.items()):
        missing = [lang for lang in (src_lang, tgt_lang) if lang not in sides]
        if missing:
            present = next(iter(sides.values()))
            raise InputFileError(present, f"has no partner {name}.{missing[0]} (or .gz) in {directory}")
        pairs.append((name, sides[src_lang], sides[tgt_lang]))
    return pairs


def resolve_inputs(params: Params, root: Path) -> dict[str, list[Input]]:
    """Every split's inputs, with every file checked to exist before anything is read."""
    data = params.data
    src_lang, tgt_lang = data.src_lang, data.tgt_lang
    if data.source == "sample":
        if {src_lang, tgt_lang} != {"en", "de"}:
            raise PipelineError(
                f"the embedded sample is English-German; data.src_lang/tgt_lang are {src_lang}/{tgt_lang}"
            )
        return {
            s: [_aligned_input(SAMPLE_DIR / f"{s}.{src_lang}", SAMPLE_DIR / f"{s}.{tgt_lang}", f"{s}.{src_lang}")]
            for s in ("train", "valid", "test")
        }
    splits: dict[str, list[Input]] = {}
    for split, entries in data.files.items():
        inputs = splits[split] = []
        for entry in entries:
            if isinstance(entry, SplitFiles):
                inputs.append(_aligned_input(_resolve(entry.src, root), _resolve(entry.tgt, root), entry.src))
            elif isinstance(entry, TsvFile):
                path, swap = _resolve(entry.tsv, root), (entry.columns or (src_lang, tgt_lang))[0] != src_lang
                inputs.append(
                    Input(
                        files=[path],
                        describe=str(path),
                        read=lambda path=path, swap=swap, origin=entry.tsv: read_tsv(path, swap, origin),
                        count=lambda path=path: count_lines(path),
                    )
                )
            elif isinstance(entry, MosesDir):
                directory = _resolve(entry.dir, root)
                for _, src, tgt in moses_pairs(directory, entry.prefix, src_lang, tgt_lang):
                    inputs.append(_aligned_input(src, tgt, str(PurePath(entry.dir) / src.name)))
    for inputs in splits.values():
        for one in inputs:
            for path in one.files:
                if not path.is_file():
                    raise InputFileError(path, "directory, not a file" if path.is_dir() else "file not found")
    return splits


def split_pairs(inputs: list[Input]) -> Iterator[Pair]:
    """The inputs' pairs, concatenated; an input without a single pair is an error naming its files."""
    for one in inputs:
        rows = 0
        for rows, pair in enumerate(one.read(), start=1):  # noqa: B007 - rows is the count after the loop
            yield pair
        if rows == 0:
            raise InputFileError(one.describe, "empty: no pairs")


# --- subsampling ------------------------------------------------------------------------------------------


def spread(pairs: Iterable[Pair], keep: int, total: int) -> Iterator[Pair]:
    """`keep` of `total` pairs evenly spaced (row i is kept when floor((i+1)k/n) > floor(ik/n)): deterministic,
    in one pass and O(1) memory, and every part of a concatenated corpus contributes its share."""
    for i, pair in enumerate(pairs):
        if (i + 1) * keep // total > i * keep // total:
            yield pair


def subsampled(pairs: Iterable[Pair], params: Params, total: int | None, note: dict[str, Any]) -> Iterable[Pair]:
    cap = params.data.max_train_pairs
    if cap is None:
        return pairs
    method = params.data.subsample if total is not None else "head"
    if params.data.subsample == "spread" and total is None:
        log.warning("the size of the training split is unknown, so max_train_pairs takes the first %d pairs", cap)
    note.update({"max_train_pairs": cap, "method": method, "from_pairs": total})
    if method == "spread" and total is not None and total > cap:
        return spread(pairs, cap, total)
    return islice(pairs, cap)


# --- writing --------------------------------------------------------------------------------------------------


def write_split(pairs: Iterable[Pair], out: Path) -> int:
    """Stream pairs into a Parquet file, one row group per BATCH_ROWS pairs; returns the row count."""
    from tqdm import tqdm

    rows = 0
    pairs = iter(pairs)
    # The total is unknown while streaming: the bar counts. disable=None: on a terminal only, not in log files.
    progress = tqdm(desc=f"download {out.stem}", unit="pairs", unit_scale=True, mininterval=2, disable=None)
    with pq.ParquetWriter(out, PAIR_SCHEMA) as writer, progress:
        while chunk := list(islice(pairs, BATCH_ROWS)):
            columns = list(zip(*chunk, strict=True))
            arrays = [pa.array(c, t) for c, t in zip(columns, PAIR_SCHEMA.types, strict=True)]
            writer.write_batch(pa.record_batch(arrays, PAIR_SCHEMA))
            rows += len(chunk)
            progress.update(len(chunk))
    return rows


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# --- WMT14 ----------------------------------------------------------------------------------------------------


def _check_hub_reachable(timeout: float = 5.0) -> None:
    """Fail at once, not after datasets' retry loop, when the hub cannot be reached."""
    hint = (
        "Hugging Face hub is unreachable{why}, so WMT14 cannot be downloaded. Download it where you have network "
        "access, or point data.source: files at local parallel files (data.files.<split>: {{src, tgt}}, {{tsv}} "
        "or {{dir}}, plain or .gz)."
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


def wmt14_split(params: Params, split: str, revision: str | None) -> tuple[Iterator[Pair], int | None]:
    src, tgt = params.data.src_lang, params.data.tgt_lang
    config = f"{tgt if src == 'en' else src}-en"
    rows, total = _load_wmt14(config, WMT14_SPLITS[split], revision)
    origin = f"{WMT14_DATASET}:{config}:{WMT14_SPLITS[split]}"

    def pairs() -> Iterator[Pair]:
        for n, row in enumerate(rows, start=1):
            yield row["translation"][src], row["translation"][tgt], origin, n

    return pairs(), total


# --- the stage ------------------------------------------------------------------------------------------------


def run(params: Params, paths: Paths) -> dict[str, Any]:
    data = params.data
    manifest: dict[str, Any] = {"source": data.source, "src_lang": data.src_lang, "tgt_lang": data.tgt_lang}
    splits: dict[str, int] = {}
    inputs_sha: dict[str, str] = {}
    subsample: dict[str, Any] = {}
    with atomic_path(paths.raw) as out:
        out.mkdir()
        if data.source == "wmt14":
            _check_hub_reachable()
            revision = _resolve_revision(data.revision)
            manifest |= {"dataset": WMT14_DATASET, "revision": revision}
            for split in WMT14_SPLITS:
                pairs, total = wmt14_split(params, split, revision)
                if split == "train":
                    pairs = subsampled(pairs, params, total, subsample)
                splits[split] = write_split(pairs, out / f"{split}.parquet")
                log.info("%s: %d pairs", split, splits[split])
        else:
            for split, inputs in resolve_inputs(params, paths.root).items():
                pairs: Iterable[Pair] = split_pairs(inputs)
                if split == "train" and data.max_train_pairs:
                    total = sum(one.count() for one in inputs) if data.subsample == "spread" else None
                    pairs = subsampled(pairs, params, total, subsample)
                splits[split] = write_split(pairs, out / f"{split}.parquet")
                for one in inputs:
                    for path in one.files:
                        inputs_sha[str(path)] = sha256(path)
                log.info("%s: %d pairs from %d input(s)", split, splits[split], len(inputs))
        if empty := [s for s, n in splits.items() if n == 0]:
            raise PipelineError(f"the {data.source} source gave no pairs for split(s) {empty}")
        manifest |= {"splits": splits, "inputs": inputs_sha}
        if subsample:
            manifest["subsample"] = subsample
        write_json(out / "manifest.json", manifest)
    return {"source": data.source, **{f"{s}_pairs": n for s, n in splits.items()}}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "download")
