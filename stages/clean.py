"""clean: normalise every split and filter the training pairs; every rejected row is kept with its reason.

Normalisation (all splits): Unicode NFC (or NFKC), control and zero-width characters removed, any run of
whitespace (Unicode spaces included) collapsed to one space, ends trimmed.
Filters (train only; valid and test sets are normalised but never filtered, so scores stay comparable), first
match wins: empty, too_short, too_long_chars, too_long_words, length_ratio, source_equals_target,
overlaps_eval (the pair also occurs in a valid/test split), duplicate (an earlier identical pair).
Work is vectorised with pyarrow.compute over streamed row groups. Output: `data/clean/<split>.parquet`,
`data/clean/rejected.parquet` (split, src, tgt, origin, line, reason) and `metrics/clean.json`; for every
split kept + rejected = input, which the stage checks before it finishes.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import PAIR_SCHEMA, iter_pair_batches
from pipeline.errors import MissingArtifact, PipelineError
from pipeline.params import CleanParams, Params

log = logging.getLogger("mtpipe.clean")

# RE2 syntax (pyarrow). C0/C1 controls except \t \n \r (handled as whitespace), zero-width and BOM characters.
CONTROL = r"[\x{0000}-\x{0008}\x{000B}\x{000C}\x{000E}-\x{001F}\x{007F}-\x{009F}\x{200B}-\x{200D}\x{2060}\x{FEFF}]"
WHITESPACE = r"[\s\x{00A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]+"
REASONS = (
    "empty",
    "too_short",
    "too_long_chars",
    "too_long_words",
    "length_ratio",
    "source_equals_target",
    "overlaps_eval",
    "duplicate",
)
REJECTED_SCHEMA = pa.schema([("split", pa.string()), *PAIR_SCHEMA, ("reason", pa.string())])


def normalize(texts: pa.Array, form: str) -> pa.Array:
    # Remove invisible characters before composing: one between a letter and its combining mark ("u", ZWSP,
    # U+0308) would otherwise block composition and leave the text in decomposed form.
    texts = pc.replace_substring_regex(texts, pattern=CONTROL, replacement="")
    texts = pc.utf8_normalize(texts, form=form)
    texts = pc.replace_substring_regex(texts, pattern=WHITESPACE, replacement=" ")
    return pc.utf8_trim(texts, characters=" ")


def pair_hashes(src: pa.Array, tgt: pa.Array) -> np.ndarray:
    """64-bit hashes of (src, tgt) pairs: 8 bytes a pair keeps corpus-wide deduplication small."""
    import pandas as pd

    keys = pc.binary_join_element_wise(src, tgt, "\t").to_numpy(zero_copy_only=False)
    return pd.util.hash_array(keys.astype(object))


def rule_masks(src: pa.Array, tgt: pa.Array, cfg: CleanParams) -> list[tuple[str, np.ndarray]]:
    """One boolean mask per row-level filter, in priority order."""
    sc, tc = (pc.utf8_length(x).to_numpy() for x in (src, tgt))
    sw, tw = (pc.add(pc.count_substring(x, " "), 1).to_numpy() for x in (src, tgt))
    shorter, longer = np.minimum(sc, tc), np.maximum(sc, tc)
    ratio_applies = shorter >= cfg.ratio_min_chars
    return [
        ("empty", shorter == 0),
        ("too_short", shorter < cfg.min_chars),
        ("too_long_chars", longer > cfg.max_chars),
        ("too_long_words", np.maximum(sw, tw) > cfg.max_words),
        ("length_ratio", ratio_applies & (longer > cfg.max_length_ratio * np.maximum(shorter, 1))),
        ("source_equals_target", pc.equal(src, tgt).to_numpy(zero_copy_only=False)),
    ]


class Cleaner:
    def __init__(self, cfg: CleanParams, rejected: pq.ParquetWriter):
        self.cfg, self.rejected = cfg, rejected
        self.eval_pairs: set[int] = set()
        self.seen: set[int] = set()

    def normalized(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        src = normalize(batch.column("src"), self.cfg.unicode_form)
        tgt = normalize(batch.column("tgt"), self.cfg.unicode_form)
        return pa.record_batch([src, tgt, batch.column("origin"), batch.column("line")], schema=PAIR_SCHEMA)

    def eval_split(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        batch = self.normalized(batch)
        self.eval_pairs.update(pair_hashes(batch.column("src"), batch.column("tgt")).tolist())
        return batch

    def train_split(self, batch: pa.RecordBatch, split: str) -> tuple[pa.RecordBatch, Counter[str]]:
        batch = self.normalized(batch)
        src, tgt = batch.column("src"), batch.column("tgt")
        reason = np.full(len(batch), None, dtype=object)
        for name, mask in rule_masks(src, tgt, self.cfg):
            reason[mask & (reason == None)] = name  # noqa: E711 - elementwise comparison
        hashes = pair_hashes(src, tgt)
        for i in np.flatnonzero(reason == None):  # noqa: E711
            h = int(hashes[i])
            if h in self.eval_pairs:
                reason[i] = "overlaps_eval"
            elif self.cfg.deduplicate and h in self.seen:
                reason[i] = "duplicate"
            else:
                self.seen.add(h)
        rejected = reason != None  # noqa: E711
        if rejected.any():
            idx = pa.array(np.flatnonzero(rejected))
            bad = batch.take(idx)
            self.rejected.write_batch(
                pa.record_batch(
                    [pa.array([split] * len(bad)), *bad.columns, pa.array(reason[rejected].tolist(), pa.string())],
                    schema=REJECTED_SCHEMA,
                )
            )
        return batch.filter(pa.array(~rejected)), Counter(reason[rejected].tolist())


def run(params: Params, paths: Paths) -> dict[str, Any]:
    if not paths.raw.exists():
        raise MissingArtifact(paths.raw, "download")
    splits = splits_in(paths.raw)
    # Valid and test splits first: their pairs must be known before training pairs can be checked against them.
    order = [s for s in splits if s != "train"] + ["train"]
    report: dict[str, Any] = {}
    with atomic_path(paths.clean) as out:
        out.mkdir()
        with pq.ParquetWriter(out / "rejected.parquet", REJECTED_SCHEMA) as rejected_writer:
            cleaner = Cleaner(params.clean, rejected_writer)
            for split in order:
                report[split] = _clean_split(cleaner, split, paths.split_file(paths.raw, split), out)
    totals = {k: sum(r[k] for r in report.values()) for k in ("input", "kept", "rejected")}
    metrics = {**totals, "splits": report}
    write_json(paths.metrics("clean"), metrics)
    train = report["train"]
    log.info("train: kept %d of %d pairs; rejected %s", train["kept"], train["input"], train["reasons"])
    return {"train_kept": train["kept"], "train_rejected": train["rejected"]}


def _clean_split(cleaner: Cleaner, split: str, source: Path, out: Path) -> dict[str, Any]:
    counts = {"input": 0, "kept": 0, "rejected": 0}
    reasons: Counter[str] = Counter()
    with pq.ParquetWriter(out / f"{split}.parquet", PAIR_SCHEMA) as writer:
        for batch in iter_pair_batches(source):
            counts["input"] += len(batch)
            if split == "train":
                batch, batch_reasons = cleaner.train_split(batch, split)
                reasons.update(batch_reasons)
            else:
                batch = cleaner.eval_split(batch)
            writer.write_batch(batch)
            counts["kept"] += len(batch)
    counts["rejected"] = sum(reasons.values())
    if counts["kept"] + counts["rejected"] != counts["input"]:
        raise PipelineError(f"clean lost rows in split '{split}': {counts}")  # an invariant, never expected
    if counts["kept"] == 0:
        raise PipelineError(f"clean kept no pairs of split '{split}' ({source}); rejected: {dict(reasons)}")
    return {**counts, "reasons": {r: reasons[r] for r in REASONS if reasons[r]}}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "clean")
