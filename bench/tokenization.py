"""Benchmark: the tokenize stage's encoding path against raw SentencePiece on the same lines, in one run.

    .venv/bin/python bench/tokenization.py [--pairs 1000000] [--repeats 3]

(Not named tokenize.py: a script's folder comes first on sys.path, and that name would hide the standard
library's `tokenize` module, which pandas and others import.)

Builds a corpus of `--pairs` en-de training pairs (one direction) from Multi30k train (replicas with small
perturbations, as in bench/data_prep.py) as cleaned Parquet, trains a SentencePiece model once (not timed), then
times
- stage:    `stages.tokenize.encode_split` end to end: read Parquet batches, encode both sides, write arrays and
            each row's direction (`train.dir.npy`);
- raw:      `SentencePieceProcessor.encode(lines, num_threads=...)` on the same lines already in memory;
and opening the encoded corpus (`TokenArray.open`, memory-mapped). Medians of `--repeats` runs.
Goal (printed, not asserted): stage >= 0.8x raw pairs/s. Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _data_prep():
    """bench/data_prep.py (a script, not a package): its corpus replication is reused here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("data_prep", REPO / "bench" / "data_prep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

GOAL_RATIO = 0.8


def build_corpus(pairs: int, multi30k: Path, out: Path, seed: int = 1) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.corpus import PAIR_SCHEMA

    data_prep = _data_prep()
    src0, tgt0 = (data_prep.read_gz_lines(multi30k / f"train.{lang}.gz") for lang in ("en", "de"))
    src, tgt = [], []
    for n in range(pairs):
        k, i = divmod(n, len(src0))
        s, t = (src0[i], tgt0[i]) if k == 0 else data_prep.perturb(src0[i], tgt0[i], k, seed)
        src.append(s)
        tgt.append(t)
    path = out / "train.parquet"
    table = pa.table({"src": src, "tgt": tgt, "src_lang": ["en"] * pairs, "tgt_lang": ["de"] * pairs,
                      "origin": ["bench"] * pairs, "line": list(range(1, pairs + 1))}, schema=PAIR_SCHEMA)
    pq.write_table(table, path, row_group_size=65_536)
    return path


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--multi30k", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    args = parser.parse_args()
    if not (args.multi30k / "train.en.gz").exists():
        sys.exit(f"Multi30k not found in {args.multi30k} (use --multi30k DIR)")
    return args


@dataclass(frozen=True)
class Preparation:
    """The untimed set-up: the corpus built, the SentencePiece model trained."""

    corpus_build_s: float
    spm_train_s: float
    vocab_size: int
    spm_version: str


@dataclass(frozen=True)
class Encodings:
    """Seconds per repeat of raw SentencePiece and of the stage's encoding, on the same lines."""

    raw_s: list[float]
    stage_s: list[float]
    mean_src_tokens: float


@dataclass(frozen=True)
class OpenedCorpus:
    """Opening the encoded corpus memory-mapped, and what it holds on disk."""

    open_s: float
    sentences: int
    last_sentence_sum: int  # read through the map, so the open is not lazy about it
    disk_mb: float
    rss_before_open_mb: float


def time_encodings(sp, model: Path, parquet: Path, out: Path, repeats: int, threads: int) -> Encodings:
    """Raw SentencePiece and the stage's encode_split, interleaved so both see the same machine state."""
    from pipeline.corpus import read_pairs
    from pipeline.runtime.languages import Directions
    from stages.tokenize import encode_split, side_by_side, spm_encoder

    eos = sp.piece_to_id("</s>")
    encoders = {side: spm_encoder(model, eos, threads) for side in ("src", "tgt")}
    direction = Directions.of(["en-de"])  # one direction, as the corpus: no target tags
    src, tgt = read_pairs(parquet)
    (out / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
    raw_s, stage_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sp.encode(src, num_threads=threads)
        sp.encode(tgt, num_threads=threads)
        raw_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        stats = encode_split([side_by_side(encoders)], parquet, out / "train", "uint16", sp.piece_to_id("<unk>"),
                             10**6, False, direction)
        stage_s.append(time.perf_counter() - t0)
    return Encodings(raw_s, stage_s, stats["src_tokens"]["mean"])


def time_open(out: Path) -> OpenedCorpus:
    """Opening the encoded corpus memory-mapped, and what it holds on disk."""
    import numpy as np

    from pipeline.token_arrays import TokenArray

    rss_before_open = rss_mb()
    t0 = time.perf_counter()
    arrays = TokenArray.open(out / "train.src")
    open_s = time.perf_counter() - t0
    last_sum = int(np.asarray(arrays[len(arrays) - 1]).sum())
    # The arrays and train.dir.npy; train.parquet (the input) shares the prefix.
    disk_mb = sum(p.stat().st_size for p in out.glob("train.*") if p.suffix != ".parquet") / 2**20
    return OpenedCorpus(open_s, len(arrays.lengths), last_sum, disk_mb, rss_before_open)


def report(args: argparse.Namespace, threads: int, prepared: Preparation, timed: Encodings,
           opened: OpenedCorpus) -> None:
    raw, stage = statistics.median(timed.raw_s), statistics.median(timed.stage_s)
    figures = {
        "pairs": args.pairs,
        "threads": threads,
        "vocab_size": prepared.vocab_size,
        "raw_pairs_per_s": round(args.pairs / raw),
        "stage_pairs_per_s": round(args.pairs / stage),
        "ratio_stage_to_raw": round(raw / stage, 3),
        "raw_seconds": [round(s, 2) for s in timed.raw_s],
        "stage_seconds": [round(s, 2) for s in timed.stage_s],
        "open_seconds": round(opened.open_s, 4),
        "encoded_mb_on_disk": round(opened.disk_mb, 1),
        "mean_src_tokens": timed.mean_src_tokens,
        "corpus_build_seconds": round(prepared.corpus_build_s, 1),
        "spm_train_seconds": round(prepared.spm_train_s, 1),
        "peak_rss_mb": round(rss_mb(), 1),
        "rss_before_open_mb": round(opened.rss_before_open_mb, 1),
        "goal_ratio": GOAL_RATIO,
        "goal_met": raw / stage >= GOAL_RATIO,
        "python": platform.python_version(),
        "sentencepiece": prepared.spm_version,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"pairs {args.pairs:,}, {threads} threads, vocab {prepared.vocab_size}, medians of {args.repeats} runs")
    print(f"  raw sentencepiece encode : {figures['raw_pairs_per_s']:>10,} pairs/s  {timed.raw_s}")
    print(f"  stage encode (end to end): {figures['stage_pairs_per_s']:>10,} pairs/s  {timed.stage_s}")
    print(f"  ratio stage/raw          : {figures['ratio_stage_to_raw']:.3f}  "
          f"(goal >= {GOAL_RATIO}: {'PASS' if figures['goal_met'] else 'MISS'})")
    print(f"  open encoded corpus      : {opened.open_s * 1000:.1f} ms ({opened.sentences:,} sentences, "
          f"{opened.disk_mb:.0f} MB on disk, last sentence id sum {opened.last_sentence_sum})")
    print(json.dumps(figures))


def main() -> None:
    args = arguments()
    import sentencepiece as spm

    from pipeline.params import parse
    from stages.tokenize import sentences_of, train_spm

    threads = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        parquet = build_corpus(args.pairs, args.multi30k, root)
        build_s = time.perf_counter() - t0
        params = parse({"tokenize": {"vocab_size": args.vocab_size, "input_sentence_size": 200_000}})
        t0 = time.perf_counter()
        model = train_spm(params, sentences_of(parquet, ("src", "tgt")), root / "spm.model")
        train_s = time.perf_counter() - t0
        sp = spm.SentencePieceProcessor(model_file=str(model))
        prepared = Preparation(build_s, train_s, sp.get_piece_size() + 1, spm.__version__)
        timed = time_encodings(sp, model, parquet, root, args.repeats, threads)
        opened = time_open(root)
    report(args, threads, prepared, timed, opened)


if __name__ == "__main__":
    main()
