"""download: bring the parallel corpus into `data/raw/<split>.parquet` (columns src, tgt, origin, line).

Three sources (`data.source`):
- `sample`: the corpus the project ships in `assets/sample/` (train/valid/test, en-de), offline;
- `files`:  aligned plain or .gz text files named in `data.files` (one sentence a line);
- `wmt14`:  WMT14 through Hugging Face `datasets` (train, newstest2013 as valid, newstest2014 as test),
            streamed so memory stays bounded; with no route to the hub it fails at once and says what to do.
Rows are streamed into Parquet in row groups; nothing is filtered here. `manifest.json` records the source,
rows per split and the sha256 of every input file.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.artifacts import SAMPLE_DIR, Paths, atomic_path, write_json
from pipeline.corpus import BATCH_ROWS, PAIR_SCHEMA
from pipeline.errors import CorpusMisaligned, HubUnreachable, InputFileError, PipelineError
from pipeline.params import Params

log = logging.getLogger("mtpipe.download")

Pair = tuple[str, str, str, int]  # src, tgt, origin, line (1-based)

WMT14_DATASET = "wmt/wmt14"
WMT14_SPLITS = {"train": "train", "valid": "validation", "newstest2014": "test"}


def read_lines(path: Path) -> Iterator[str]:
    """Lines of a plain or gzip UTF-8 file without line ends; CRLF and a leading BOM are handled.

    Invalid UTF-8 or a truncated .gz raise InputFileError naming the file and line.
    """
    if not path.is_file():
        raise InputFileError(path, "file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    number = 0
    try:
        with opener(path, "rb") as f:
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


def read_parallel(src_path: Path, tgt_path: Path) -> Iterator[Pair]:
    """Pairs of two aligned files; a length mismatch raises CorpusMisaligned with both paths and counts."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    origin = src_path.name
    n = 0
    # Not zip(): it consumes (and loses) the source's extra line before noticing the target has ended.
    for n, (src, tgt) in enumerate(zip_longest(src_lines, tgt_lines), start=1):
        if src is None or tgt is None:
            extra_src, extra_tgt = sum(1 for _ in src_lines), sum(1 for _ in tgt_lines)
            lines_src = n - 1 + (src is not None) + extra_src
            lines_tgt = n - 1 + (tgt is not None) + extra_tgt
            raise CorpusMisaligned(src_path, tgt_path, lines_src, lines_tgt)
        yield src, tgt, origin, n


def write_split(pairs: Iterable[Pair], out: Path) -> int:
    """Stream pairs into a Parquet file, one row group per BATCH_ROWS pairs; returns the row count."""
    rows = 0
    with pq.ParquetWriter(out, PAIR_SCHEMA) as writer:
        while chunk := list(islice(pairs, BATCH_ROWS)):
            columns = list(zip(*chunk, strict=True))
            arrays = [pa.array(c, t) for c, t in zip(columns, PAIR_SCHEMA.types, strict=True)]
            writer.write_batch(pa.record_batch(arrays, PAIR_SCHEMA))
            rows += len(chunk)
    return rows


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _resolve(path: str, root: Path) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else root / p


def file_sources(params: Params, root: Path) -> dict[str, tuple[Path, Path]]:
    if params.data.source == "sample":
        langs = {params.data.src_lang, params.data.tgt_lang}
        if langs != {"en", "de"}:
            raise PipelineError(f"the embedded sample is English-German; data.src_lang/tgt_lang are {sorted(langs)}")
        names = ("train", "valid", "test")
        src, tgt = params.data.src_lang, params.data.tgt_lang
        return {s: (SAMPLE_DIR / f"{s}.{src}", SAMPLE_DIR / f"{s}.{tgt}") for s in names}
    return {s: (_resolve(f.src, root), _resolve(f.tgt, root)) for s, f in params.data.files.items()}


def _check_hub_reachable(timeout: float = 5.0) -> None:
    """Fail at once, not after datasets' retry loop, when the hub cannot be reached."""
    hint = (
        "Hugging Face hub is unreachable{why}, so WMT14 cannot be downloaded. Download it where you have network "
        "access, or point data.source: files at local parallel files (data.files.<split>.src/tgt, plain or .gz)."
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


def wmt14_pairs(params: Params, split: str) -> Iterator[Pair]:
    from datasets import load_dataset

    src, tgt = params.data.src_lang, params.data.tgt_lang
    other = tgt if src == "en" else src
    config = f"{other}-en"
    dataset = load_dataset(WMT14_DATASET, config, split=WMT14_SPLITS[split], streaming=True)
    rows: Iterable[dict[str, Any]] = dataset
    if split == "train" and params.data.max_train_pairs:
        rows = islice(rows, params.data.max_train_pairs)
    origin = f"{WMT14_DATASET}:{config}:{WMT14_SPLITS[split]}"
    for n, row in enumerate(rows, start=1):
        yield row["translation"][src], row["translation"][tgt], origin, n


def run(params: Params, paths: Paths) -> dict[str, Any]:
    manifest: dict[str, Any] = {"source": params.data.source, "src_lang": params.data.src_lang,
                                "tgt_lang": params.data.tgt_lang, "splits": {}, "inputs": {}}
    with atomic_path(paths.raw) as out:
        out.mkdir()
        if params.data.source == "wmt14":
            _check_hub_reachable()
            manifest["dataset"] = WMT14_DATASET
            for split in WMT14_SPLITS:
                manifest["splits"][split] = write_split(wmt14_pairs(params, split), out / f"{split}.parquet")
                log.info("%s: %d pairs", split, manifest["splits"][split])
        else:
            for split, (src_path, tgt_path) in file_sources(params, paths.root).items():
                pairs = read_parallel(src_path, tgt_path)
                if split == "train" and params.data.max_train_pairs:
                    pairs = islice(pairs, params.data.max_train_pairs)
                manifest["splits"][split] = write_split(pairs, out / f"{split}.parquet")
                if manifest["splits"][split] == 0:
                    raise InputFileError(src_path, f"split '{split}' is empty (and so is {tgt_path})")
                for p in (src_path, tgt_path):
                    manifest["inputs"][str(p)] = sha256(p)
                log.info("%s: %d pairs from %s", split, manifest["splits"][split], src_path.parent)
        if empty := [s for s, n in manifest["splits"].items() if n == 0]:
            raise PipelineError(f"the {params.data.source} source gave no pairs for split(s) {empty}")
        write_json(out / "manifest.json", manifest)
    return {"source": params.data.source, **{f"{s}_pairs": n for s, n in manifest["splits"].items()}}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "download")
