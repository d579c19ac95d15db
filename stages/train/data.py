"""The encoded data of a run, opened once: token arrays, each pair's direction, the train and valid batches.

Everything comes from data/tokenized (the tokenize stage's outputs): meta.json, the memory-mapped
`<split>.src`/`<split>.tgt` arrays (pipeline.token_arrays) and `<split>.dir.npy` (directions.py), for the train
and valid splits. numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.token_arrays import TokenArray
from stages.train.batching import Collator
from stages.train.directions import direction_names, row_directions, rows_by_direction, valid_batches
from stages.train.sampling import EpochBatches


@dataclass
class RunData:
    meta: dict[str, Any]  # data/tokenized/meta.json
    directions: list[str]  # meta["directions"]: index d of the row numbers below is directions[d]
    train: Collator
    valid: Collator
    train_rows: list[np.ndarray]  # each direction's train row numbers
    valid_rows: list[np.ndarray]
    epochs: EpochBatches  # each epoch's train batches
    valid_batches: list[tuple[int, np.ndarray]]  # (direction, rows): fixed for the run


def split_data(tokenized: Path, split: str, meta: dict[str, Any], names: list[str],
               max_len: int) -> tuple[Collator, list[np.ndarray]]:
    """A split's pairs, collated as the model takes them, and each direction's row numbers."""
    src, tgt = TokenArray.open(tokenized / f"{split}.src"), TokenArray.open(tokenized / f"{split}.tgt")
    rows = rows_by_direction(row_directions(tokenized, split, len(src), names), names, split)
    return Collator(src, tgt, meta["pad_id"], max_len), rows


def load_data(tokenized: Path, train_params: Any) -> RunData:
    """The run's data (`train_params`: the validated `train:` params, as the loop holds them)."""
    meta = json.loads((tokenized / "meta.json").read_text())
    names = direction_names(meta, tokenized)
    train, train_rows = split_data(tokenized, "train", meta, names, train_params.max_len)
    valid, valid_rows = split_data(tokenized, "valid", meta, names, train_params.max_len)
    return RunData(
        meta=meta, directions=names, train=train, valid=valid, train_rows=train_rows, valid_rows=valid_rows,
        epochs=EpochBatches(*train.lengths(), train_rows, train_params.max_tokens, train_params.seed,
                            train_params.temperature),
        valid_batches=valid_batches(*valid.lengths(), valid_rows, train_params.max_tokens, train_params.seed),
    )
