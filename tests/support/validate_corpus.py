"""A cleaned corpus of a handful of en-de pairs that passes the validate stage's suite, written as the clean stage
writes `data/clean/<split>.parquet`: the validate tests add faulty rows to it, and the Data Docs tests render its
pages."""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts import Paths
from tests.conftest import write_pair_parquet

GOOD_TRAIN = [
    ("A dog runs in the park.", "Ein Hund rennt im Park."),
    ("Two children play football.", "Zwei Kinder spielen Fußball."),
    ("The woman reads a book.", "Die Frau liest ein Buch."),
    ("Yes.", "Ja, sehr gerne."),  # ratio 3.75 > 3, but the shorter side is under ratio_min_chars
    ("A man rides a red bicycle.", "Ein Mann fährt ein rotes Fahrrad."),
]
GOOD_HELDOUT = [("A cat sleeps.", "Eine Katze schläft."), ("It rains.", "Es regnet.")]


def write_split(root: Path, split: str, pairs: list[tuple[str | None, str | None]]) -> None:
    write_pair_parquet(root / "data" / "clean" / f"{split}.parquet", pairs, f"{split}.en")


def corpus(root: Path, train: list, valid: list = GOOD_HELDOUT, test: list = GOOD_HELDOUT) -> Paths:
    write_split(root, "train", train)
    write_split(root, "valid", valid)
    write_split(root, "test", test)
    return Paths(root)
