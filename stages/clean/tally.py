"""What clean counts of each split: rows in, kept and rejected with their reasons, per direction.

Kept and rejected are counted from what is written, so the stage proves kept + rejected = input for every split and
direction before it finishes, and refuses a run that leaves a direction without training or validation pairs.
`metrics/clean.json` is made of these figures.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import Directions
from stages.clean.filters import REASONS


class SplitTally:
    """Rows in, kept and rejected (with their reasons) of one split, per direction. Kept and rejected are counted
    from what is written, apart from the input count, so `check` proves nothing was lost."""

    def __init__(self, split: str, source: Path):
        self.split, self.source = split, source
        self.input: Counter[str] = Counter()
        self.kept: Counter[str] = Counter()
        self.reasons: dict[str, Counter[str]] = {}

    def add(self, labels: pa.Array, written: pa.Array, rejected_labels: pa.Array, reasons: list[str]) -> None:
        """One batch: every row's direction, the directions of the rows written out and of the rows rejected."""
        self.input.update(_value_counts(labels))
        self.kept.update(_value_counts(written))
        for direction, reason in zip(rejected_labels.to_pylist(), reasons, strict=True):
            self.reasons.setdefault(direction, Counter())[reason] += 1

    def of(self, direction: str) -> dict[str, int]:
        rejected = sum(self.reasons.get(direction, Counter()).values())
        return {"input": self.input[direction], "kept": self.kept[direction], "rejected": rejected}

    def reasons_of(self, direction: str | None = None) -> dict[str, int]:
        """The reasons of one direction, or of the whole split, in the order of REASONS."""
        counts = self.reasons.get(direction, Counter()) if direction else sum(self.reasons.values(), Counter())
        return {r: counts[r] for r in REASONS if counts[r]}

    def totals(self) -> dict[str, Any]:
        figures = [self.of(d) for d in self.input]
        return {**{k: sum(f[k] for f in figures) for k in ("input", "kept", "rejected")}, "reasons": self.reasons_of()}

    def check(self) -> None:
        """kept + rejected = input for every direction (an invariant, never expected to fail), and some pairs kept."""
        for direction in sorted({*self.input, *self.kept, *self.reasons}):
            counts = self.of(direction)
            if counts["kept"] + counts["rejected"] != counts["input"]:
                raise PipelineError(f"clean lost rows of direction {direction} in split '{self.split}': {counts}")
        if not sum(self.kept.values()):
            raise PipelineError(
                f"clean kept no pairs of split '{self.split}' ({self.source}); rejected: {self.reasons_of()}"
            )


def _value_counts(labels: pa.Array) -> Counter[str]:
    counts = pc.value_counts(labels)
    return Counter(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True)))


def check_every_direction_trains(tallies: dict[str, SplitTally], directions: Directions) -> None:
    """Each direction of data.directions keeps training pairs and has valid pairs (when there is a valid split);
    otherwise the model could not learn or be validated on it: a PipelineError naming the direction."""
    train = tallies["train"]
    for d in directions.names:
        if not train.kept[d]:
            raise PipelineError(f"clean kept no training pairs of direction {d} ({train.input[d]} in "
                                f"{train.source}); rejected: {train.reasons_of(d)}")
        if "valid" in tallies and not tallies["valid"].input[d]:
            raise PipelineError(f"{tallies['valid'].source} has no pairs of direction {d}: every direction needs "
                                "validation pairs")
