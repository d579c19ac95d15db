"""What the stage reads: the trained model (`models/final`, with `from_pretrained`), its directions (its
`languages.json`), its special ids, and the parity pairs of every direction.

A direction's parity pairs are its first `export.parity_sentences` pairs in the first test split of `data/clean`
that holds any; a direction no test split holds (a test split may cover a subset of the directions) is checked on
its valid pairs instead, which every direction has, so the gate covers every direction the model translates. The
sources are tagged as the model reads them (`>>fr<< ...` when it has several targets).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, test_splits
from pipeline.corpus import read_pairs_by_direction
from pipeline.decoding import SpecialIds
from pipeline.errors import MissingArtifact, ParityFailed, PipelineError
from pipeline.languages import Direction, Directions

log = logging.getLogger("mtpipe.export")

# Where a direction no test split holds takes its parity pairs from.
FALLBACK_SPLIT = "valid"


@dataclass(frozen=True)
class ParityPairs:
    """One direction's parity pairs: the split they come from, the source ids as the model reads them (tag first
    when targets are tagged), the reference ids (teacher forcing) and the reference texts (BLEU)."""

    split: str
    sources: list[list[int]]
    targets: list[list[int]]
    references: list[str]


def load_model(paths: Paths) -> tuple[Any, Any]:
    """(MarianMTModel in fp32 and eval mode, its tokenizer) from models/final."""
    import torch
    from transformers import AutoTokenizer, MarianMTModel

    if not (paths.final_model / "config.json").is_file():
        raise MissingArtifact(paths.final_model, "train")
    model = MarianMTModel.from_pretrained(paths.final_model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(paths.final_model)
    return model, tokenizer


def model_directions(model_dir: Path, tokenizer: Any) -> Directions:
    """The directions models/final records; PipelineError when it records none, or when its tokenizer lacks a
    target tag (the model could not be asked for that target)."""
    try:
        directions = Directions.read(model_dir)
    except ValueError as err:
        raise PipelineError(f"{err}: train it again (`dvc repro tokenize train`)") from None
    for tag in directions.tags:
        if tokenizer.convert_tokens_to_ids(tag) in (None, tokenizer.unk_token_id):
            raise PipelineError(f"{model_dir}: the tokenizer has no {tag} token, which the model's directions "
                                f"{', '.join(directions.names)} need: train it again (`dvc repro tokenize train`)")
    return directions


def special_ids_of(model_config: Any) -> SpecialIds:
    """The ids decoding starts from, ends on and pads with, from a transformers model config."""
    return SpecialIds(start=model_config.decoder_start_token_id, eos=model_config.eos_token_id,
                      pad=model_config.pad_token_id)


def _first_pairs(paths: Paths, directions: Directions, count: int) -> dict[str, tuple[str, list[str], list[str]]]:
    """direction -> (split, its first `count` sources, their references), from the first split holding it."""
    splits = test_splits(paths.clean)
    if not splits:
        raise MissingArtifact(paths.split_file(paths.clean, "test"), "clean")
    found: dict[str, tuple[str, list[str], list[str]]] = {}
    for split in [*splits, FALLBACK_SPLIT]:
        missing = [name for name in directions.names if name not in found]
        path = paths.split_file(paths.clean, split)
        if not missing or not path.is_file():
            break
        if split == FALLBACK_SPLIT:
            log.warning("%s: no pairs in the test splits (%s): checking parity on the %s split's",
                        ", ".join(missing), ", ".join(splits), split)
        by_direction = read_pairs_by_direction(path)
        for name in missing:
            if by_direction.get(name, ((), (), ()))[1]:
                _, sources, references = by_direction[name]
                found[name] = (split, sources[:count], references[:count])
    absent = [name for name in directions.names if name not in found]
    if absent:
        raise ParityFailed(f"no pairs of {', '.join(absent)} in {paths.clean} (test splits: {', '.join(splits)}; "
                           f"nor in {FALLBACK_SPLIT}) to check parity on")
    return found


def parity_pairs(paths: Paths, directions: Directions, count: int, tokenizer: Any, max_positions: int
                 ) -> dict[str, ParityPairs]:
    """Every direction's parity pairs (in the model's direction order), tokenized as the model reads them."""
    pairs = {}
    for name, (split, sources, references) in _first_pairs(paths, directions, count).items():
        tagged = [directions.tagged(s, Direction.parse(name).tgt) for s in sources]
        pairs[name] = ParityPairs(
            split=split,
            sources=tokenizer(tagged, truncation=True, max_length=max_positions)["input_ids"],
            targets=tokenizer(text_target=references, truncation=True, max_length=max_positions)["input_ids"],
            references=references,
        )
    return {name: pairs[name] for name in directions.names}
