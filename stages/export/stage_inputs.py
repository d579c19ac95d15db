"""What the stage reads: the trained model (`models/final`, with `from_pretrained`, after checking it is of a
supported family), its languages (its `languages.json`: directions, family and each direction's layout), and the
parity pairs of every direction.

A direction's parity pairs are its first `export.parity_sentences` pairs in the first test split of `data/clean`
that holds any; a direction no test split holds (a test split may cover a subset of the directions) is checked on
its valid pairs instead, which every direction has, so the gate covers every direction the model translates. The
sources are read as the model reads them: the direction's layout around the text's plain pieces (`>>fr<< ...`
for a Marian multi-target model, `en_XX ... </s>` for mBART-50), and the references as its labels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pipeline.artifacts import Paths, test_splits
from pipeline.corpus import read_pairs_by_direction
from pipeline.errors import MissingArtifact, ParityFailed
from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.languages import Directions
from pipeline.runtime.model_languages import DirectionLayout, ModelLanguages

log = logging.getLogger("mtpipe.export")

# Where a direction no test split holds takes its parity pairs from.
FALLBACK_SPLIT = "valid"


@dataclass(frozen=True)
class ParityPairs:
    """One direction's parity pairs: the split they come from, the direction's layout, the source ids as the model
    reads them, the reference ids as its labels (teacher forcing: the decoder reads the start token, then the
    labels without the last) and the reference texts (BLEU)."""

    split: str
    layout: DirectionLayout
    sources: list[list[int]]
    targets: list[list[int]]
    references: list[str]


def load_model(paths: Paths) -> tuple[Any, Any]:
    """(the seq2seq model in fp32 and eval mode, its tokenizer) from models/final (whose languages the caller has
    read: ModelLanguages.read refuses a checkpoint of an unsupported family before anything is loaded)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(paths.final_model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(paths.final_model)
    return model, tokenizer


def special_ids_of(model_config: Any, languages: ModelLanguages) -> SpecialIds:
    """The ids decoding ends on and pads with, from a transformers model config, and the one it starts from: the
    directions' common decoder start, or None where they start from different tokens (mBART-cc25 starts from the
    target's code; each layout holds its own)."""
    starts = {layout.decoder_start for layout in languages.layouts.values()}
    return SpecialIds(start=starts.pop() if len(starts) == 1 else None, eos=model_config.eos_token_id,
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


def _framed(layout_prefix: tuple[int, ...], pieces: list[int], layout_suffix: tuple[int, ...], max_positions: int
            ) -> list[int]:
    """Pieces framed by a layout's prefix and suffix, the pieces cut so the whole fits the model's positions."""
    room = max(max_positions - len(layout_prefix) - len(layout_suffix), 0)
    return [*layout_prefix, *pieces[:room], *layout_suffix]


def parity_pairs(paths: Paths, languages: ModelLanguages, count: int, tokenizer: Any, max_positions: int
                 ) -> dict[str, ParityPairs]:
    """Every direction's parity pairs (in the model's direction order), as the model reads them: the layout around
    the plain pieces (`tokenizer(text, add_special_tokens=False)`) of sources and of references."""
    directions = languages.directions
    pairs = {}
    for name, (split, sources, references) in _first_pairs(paths, directions, count).items():
        layout = languages.layout(name)
        source_pieces = tokenizer(sources, add_special_tokens=False)["input_ids"]
        target_pieces = tokenizer(text_target=references, add_special_tokens=False)["input_ids"]
        pairs[name] = ParityPairs(
            split=split,
            layout=layout,
            sources=[_framed(layout.source_prefix, p, layout.source_suffix, max_positions) for p in source_pieces],
            targets=[_framed(layout.target_prefix, p, layout.target_suffix, max_positions) for p in target_pieces],
            references=references,
        )
    return {name: pairs[name] for name in directions.names}
