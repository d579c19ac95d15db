"""The encoded data of a run, opened once: token arrays, each pair's direction, the train and valid batches.

Everything comes from data/tokenized (the tokenize stage's outputs): meta.json, the memory-mapped
`<split>.src`/`<split>.tgt` arrays (pipeline.token_arrays) and `<split>.dir.npy` (directions.py), for the train
and valid splits, and `hf_tokenizer/languages.json` (pipeline.runtime.model_languages.ModelLanguages): the
directions dir.npy indexes, the checkpoint family and each direction's layout, from which the collators take each
direction's decoder start id and the special ids truncation keeps, and train-time BLEU each direction's decoder prefix.
numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifacts import TOKENIZER_DIR
from pipeline.runtime.model_languages import ModelLanguages
from pipeline.token_arrays import TokenArray
from stages.train.batching import Collator
from stages.train.directions import row_directions, rows_by_direction, valid_batches
from stages.train.sampling import EpochBatches


@dataclass
class RunData:
    meta: dict[str, Any]  # data/tokenized/meta.json
    directions: list[str]  # languages.json's: index d of the row numbers below is directions[d]
    languages: ModelLanguages  # the family, the codes and each direction's layout
    train: Collator
    valid: Collator
    train_rows: list[np.ndarray]  # each direction's train row numbers
    valid_rows: list[np.ndarray]
    epochs: EpochBatches  # each epoch's train batches
    valid_batches: list[tuple[int, np.ndarray]]  # (direction, rows): fixed for the run


def split_data(tokenized: Path, split: str, meta: dict[str, Any], languages: ModelLanguages,
               max_len: int) -> tuple[Collator, list[np.ndarray]]:
    """A split's pairs, collated as the model takes them (each row by its direction's layout), and each
    direction's row numbers."""
    names = languages.directions.names
    src, tgt = TokenArray.open(tokenized / f"{split}.src"), TokenArray.open(tokenized / f"{split}.tgt")
    direction_of_row = row_directions(tokenized, split, len(src), names)
    layouts = [languages.layout(name) for name in names]
    return (Collator(src, tgt, meta["pad_id"], max_len, direction_of_row, layouts),
            rows_by_direction(direction_of_row, names, split))


def load_data(tokenized: Path, train_params: Any) -> RunData:
    """The run's data (`train_params`: the validated `train:` params, as the loop holds them)."""
    meta = json.loads((tokenized / "meta.json").read_text())
    languages = ModelLanguages.read(tokenized / TOKENIZER_DIR)
    names = languages.directions.names
    train, train_rows = split_data(tokenized, "train", meta, languages, train_params.max_len)
    valid, valid_rows = split_data(tokenized, "valid", meta, languages, train_params.max_len)
    return RunData(
        meta=meta, directions=names, languages=languages, train=train, valid=valid, train_rows=train_rows,
        valid_rows=valid_rows,
        epochs=EpochBatches(*train.lengths(), train_rows, train_params.max_tokens, train_params.seed,
                            train_params.temperature,
                            [train_params.direction_weights.get(name, 1.0) for name in names]),
        valid_batches=valid_batches(*valid.lengths(), valid_rows, train_params.max_tokens, train_params.seed),
    )
