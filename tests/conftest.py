"""Shared fixtures: corpora built from the real Multi30k files in ../shared, and a small model made here."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "0")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


def multi30k_lines(name: str, lang: str, limit: int | None = None) -> list[str]:
    path = MULTI30K / f"{name}.{lang}.gz"
    if not path.exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:limit]


def write_pair_parquet(path: Path, pairs: list, origin: str, direction: str = "en-de") -> Path:
    """A pair Parquet file (PAIR_SCHEMA) of one direction from (src, tgt) tuples, lines numbered from 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.corpus import PAIR_SCHEMA

    src_lang, tgt_lang = direction.split("-")
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs], "src_lang": [src_lang] * len(pairs),
         "tgt_lang": [tgt_lang] * len(pairs), "origin": [origin] * len(pairs),
         "line": list(range(1, len(pairs) + 1))},
        schema=PAIR_SCHEMA,
    )
    pq.write_table(table, path)
    return path


def write_clean_splits(root: Path, sizes: dict[str, int], directions: tuple[str, ...] = ("en-de",)) -> Path:
    """Write data/clean/<split>.parquet from Multi30k, the first n lines of each direction one after another:
    train and valid from train/val, other splits from test_2016_flickr."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.corpus import PAIR_SCHEMA

    source = {"train": "train", "valid": "val"}
    out = root / "data" / "clean"
    out.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        name = source.get(split, "test_2016_flickr")
        columns: dict[str, list] = {column: [] for column in PAIR_SCHEMA.names}
        for direction in directions:
            src_lang, tgt_lang = direction.split("-")
            src, tgt = multi30k_lines(name, src_lang, n), multi30k_lines(name, tgt_lang, n)
            columns["src"] += src
            columns["tgt"] += tgt
            columns["src_lang"] += [src_lang] * len(src)
            columns["tgt_lang"] += [tgt_lang] * len(src)
            columns["origin"] += [f"{name}.{src_lang}"] * len(src)
            columns["line"] += list(range(1, len(src) + 1))
        pq.write_table(pa.table(columns, schema=PAIR_SCHEMA), out / f"{split}.parquet")
    return out


def write_interleaved_splits(root: Path, sizes: dict[str, int], directions: tuple[str, ...]) -> Path:
    """write_clean_splits with every split's rows shuffled (seeded), so that a batch mixes the directions row by
    row and what a stage writes must come back in row order."""
    import numpy as np
    import pyarrow.parquet as pq

    clean = write_clean_splits(root, sizes, directions)
    rng = np.random.default_rng(5)
    for split in sizes:
        table = pq.read_table(clean / f"{split}.parquet")
        pq.write_table(table.take(rng.permutation(len(table))), clean / f"{split}.parquet")
    return clean


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An untrained tiny Marian model with the project's tokenizer, saved as `models/final` would be."""
    from pipeline.artifacts import Paths
    from pipeline.params import parse
    from stages import tokenize
    from stages.train.model import build_model
    from stages.train.save import save_final

    root = tmp_path_factory.mktemp("tiny_model")
    write_clean_splits(root, {"train": 2000, "valid": 50, "test": 50})
    params = parse({"tokenize": {"vocab_size": 1000}, "model": {"preset": "tiny"}})
    paths = Paths(root)
    tokenize.run(params, paths)
    import json

    meta = json.loads((paths.tokenized / "meta.json").read_text())
    model = build_model(params.model, meta["vocab_size"], meta["pad_id"], meta["eos_id"])
    save_final(model, paths.tokenized / "hf_tokenizer", paths.final_model)
    return paths.final_model


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A factory: `tiny_checkpoint("mbart50")` -> a tiny random save_pretrained checkpoint of that family
    (tests/unit/tiny_checkpoints.py FAMILY_NAMES), built once per session. Treat it as read-only: copy it
    (`build_tiny(family, dir)`) to change it."""
    from tests.unit.tiny_checkpoints import build_tiny

    built: dict[str, Path] = {}

    def checkpoint(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny(family, tmp_path_factory.mktemp(f"tiny_{family}") / "checkpoint")
        return built[family]

    return checkpoint
