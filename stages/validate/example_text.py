"""The text of the training split's example rows, looked up by origin and line: GX saw only their measures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.corpus import iter_pair_batches


def fetch_rows(path: Path, keys: set[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The pairs at the given (origin, line) of a split, streamed (for example rows of failed expectations)."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    lines = pa.array(sorted({line for _, line in keys}), pa.int64())
    for batch in iter_pair_batches(path):
        candidates = batch.filter(pc.is_in(batch.column("line"), value_set=lines))
        for pair in candidates.to_pylist():
            if (pair["origin"], pair["line"]) in keys:
                found[(pair["origin"], pair["line"])] = pair
        if len(found) == len(keys):
            break
    return found


def add_example_text(train_file: Path, summary: dict[str, Any]) -> None:
    """Fill in src and tgt of the train split's example rows in its summary (see merge.summarise)."""
    failures = summary["failed_critical"] + summary["failed_non_critical"]
    wanted = {(r.get("origin"), r.get("line")) for f in failures for r in f["rows"]}
    texts = fetch_rows(train_file, wanted) if wanted else {}
    for failure in failures:
        for row in failure["rows"]:
            pair = texts.get((row.get("origin"), row.get("line")), {})
            row.update({"src": pair.get("src"), "tgt": pair.get("tgt")})
        if failure.get("column") == "is_duplicate":  # True says nothing: show the pair that repeats
            failure["examples"] = [f"{r['src']}\t{r['tgt']}" for r in failure["rows"]]
