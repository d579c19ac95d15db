"""Fixtures of tests/unit and tests/e2e: corpora built from the real Multi30k files in ../shared, a small model
made here, the tiny checkpoints of every family and one export of a two-target model (the export, translate and
service fixtures only tests/e2e takes are in tests/e2e/conftest.py)."""

from __future__ import annotations

import gzip
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "0")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


def pytest_configure(config) -> None:
    """Under pytest-xdist each worker runs on its own share of the cores (its CPU affinity, which every process it
    starts inherits, and which torch and the train stage size their threads by): N workers on N cores then run side
    by side instead of each starting a thread per core and taking turns on them."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) :: count])


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py imported as a module (the benches are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_bench", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def multi30k_lines(name: str, lang: str, limit: int | None = None) -> list[str]:
    path = MULTI30K / f"{name}.{lang}.gz"
    if not path.exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:limit]


def write_marian_languages(directory: Path, names: list[str], eos: int = 0, pad: int = 9) -> None:
    """A languages.json as the tokenize stage records a model of its own for `names`: the Marian layout, with the
    targets' tags as codes (ids pad + 1, ...) when there are several targets."""
    from pipeline.runtime.languages import Directions
    from pipeline.runtime.model_languages import DirectionLayout, ModelLanguages, family_named

    directions = Directions.of(names)
    tags = {t: pad + 1 + i for i, t in enumerate(directions.targets)} if directions.target_tags else {}
    layouts = {str(d): DirectionLayout((tags[d.tgt],) if tags else (), (eos,), (), (eos,), pad)
               for d in directions.directions}
    codes = {t: f">>{t}<<" for t in tags}
    ModelLanguages(directions, family_named("marian"), codes, layouts).write(directory)


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
    (tests/support/tiny_checkpoints.py FAMILY_NAMES), built once per session. Treat it as read-only: copy it
    (`build_tiny(family, dir)`) to change it."""
    from tests.support.tiny_checkpoints import build_tiny

    built: dict[str, Path] = {}

    def checkpoint(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny(family, tmp_path_factory.mktemp(f"tiny_{family}") / "checkpoint")
        return built[family]

    return checkpoint


@pytest.fixture(scope="session")
def make_two_target_root(tmp_path_factory):
    """A factory of fresh project roots with the sharpened two-target model (en-de, en-fr: sources tagged >>de<< /
    >>fr<<) and its en-de and en-fr splits (tests/support/export_helpers.py)."""
    from tests.support.export_helpers import sharpened_root, two_target_model_dir

    model_dir = two_target_model_dir(tmp_path_factory.mktemp("two_target_model"))
    return lambda: sharpened_root(model_dir, tmp_path_factory.mktemp("two_target_root"))


@pytest.fixture(scope="session")
def two_target_exported(make_two_target_root):
    """The paths of one export of the two-target model: fp32 ONNX, and CTranslate2 (in float32, so its outputs can
    be held to PyTorch's) where it is installed. It runs the export stage: a test that takes it is marked e2e."""
    from stages import export
    from tests.support.export_helpers import CTRANSLATE2_INSTALLED, export_params, one_torch_thread

    paths = make_two_target_root()
    settings = {"int8": False, "torchscript": False, "ctranslate2": CTRANSLATE2_INSTALLED,
                "ctranslate2_quantization": "float32"}
    with one_torch_thread():
        export.run(export_params(**settings), paths)
    return paths
