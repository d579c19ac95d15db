"""The text of the training split's example rows, looked up by direction, origin and line: GX saw only their
measures. The direction is part of the key since one origin may serve several directions (a multi-way corpus's
English file pairs with each of its other languages' files, line by line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.corpus import iter_pair_batches
from stages.validate.directions import direction_names

RowKey = tuple[str, str, int]  # direction, origin, line


def fetch_rows(path: Path, keys: set[RowKey]) -> dict[RowKey, dict[str, Any]]:
    """The pairs at the given (direction, origin, line) of a split, streamed (for example rows of failed
    expectations)."""
    found: dict[RowKey, dict[str, Any]] = {}
    lines = pa.array(sorted({line for _, _, line in keys}), pa.int64())
    for batch in iter_pair_batches(path):
        candidates = batch.filter(pc.is_in(batch.column("line"), value_set=lines))
        directions = direction_names(candidates).to_pylist()
        for direction, pair in zip(directions, candidates.to_pylist(), strict=True):
            if (direction, pair["origin"], pair["line"]) in keys:
                found[(direction, pair["origin"], pair["line"])] = pair
        if len(found) == len(keys):
            break
    return found


def add_example_text(train_file: Path, groups: dict[str, dict[str, Any]]) -> None:
    """Fill in src and tgt of the example rows in the train split's direction groups (direction -> summary, see
    merge.summarise)."""
    failures = [
        (direction, failure)
        for direction, summary in groups.items()
        for failure in summary["failed_critical"] + summary["failed_non_critical"]
    ]
    wanted = {(d, r.get("origin"), r.get("line")) for d, f in failures for r in f["rows"]}
    texts = fetch_rows(train_file, wanted) if wanted else {}
    for direction, failure in failures:
        for row in failure["rows"]:
            pair = texts.get((direction, row.get("origin"), row.get("line")), {})
            row.update({"src": pair.get("src"), "tgt": pair.get("tgt")})
        if failure.get("column") == "is_duplicate":  # True says nothing: show the pair that repeats
            failure["examples"] = [f"{r['src']}\t{r['tgt']}" for r in failure["rows"]]
