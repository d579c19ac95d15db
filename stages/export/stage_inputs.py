"""What the stage reads: the trained model (`models/final`, with `from_pretrained`), its special ids, and the
parity pairs (the first `export.parity_sentences` of the first test split of `data/clean`)."""

from __future__ import annotations

from typing import Any

from pipeline.artifacts import Paths, test_splits
from pipeline.corpus import read_pairs
from pipeline.decoding import SpecialIds
from pipeline.errors import MissingArtifact, ParityFailed


def load_model(paths: Paths) -> tuple[Any, Any]:
    """(MarianMTModel in fp32 and eval mode, its tokenizer) from models/final."""
    import torch
    from transformers import AutoTokenizer, MarianMTModel

    if not (paths.final_model / "config.json").is_file():
        raise MissingArtifact(paths.final_model, "train")
    model = MarianMTModel.from_pretrained(paths.final_model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(paths.final_model)
    return model, tokenizer


def special_ids_of(model_config: Any) -> SpecialIds:
    """The ids decoding starts from, ends on and pads with, from a transformers model config."""
    return SpecialIds(start=model_config.decoder_start_token_id, eos=model_config.eos_token_id,
                      pad=model_config.pad_token_id)


def parity_pairs(paths: Paths, count: int) -> tuple[list[str], list[str]]:
    """(sources, references): the first `count` pairs of the first test split."""
    splits = test_splits(paths.clean)
    if not splits:
        raise MissingArtifact(paths.split_file(paths.clean, "test"), "clean")
    path = paths.split_file(paths.clean, splits[0])
    sources, references = read_pairs(path)
    if not sources:
        raise ParityFailed(f"{path} has no sentence pairs to check parity on")
    return sources[:count], references[:count]
