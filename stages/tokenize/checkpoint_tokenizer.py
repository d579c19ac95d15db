"""A pretrained checkpoint's own tokenizer, one direction at a time: setting it to a direction, measuring where it
puts that direction's special ids (the DirectionLayout every later stage reads), and encoding a batch of the
direction's rows.

A family that sets languages (mBART, mBART-50, M2M-100, NLLB) is told `src_lang`/`tgt_lang` and places the codes
itself; Marian has no such setting: a multi-target checkpoint (one whose vocabulary holds `>>xx<<` tags) reads the
target's tag as text in front of the source, a single-target one gets the text alone. Either way the ids are the
tokenizer's own, `tokenizer(src, text_target=tgt)`, so the arrays are exactly what the checkpoint was trained on.

The layout is measured, not looked up: the tokenizer encodes a probe with and without its special tokens, and the
difference (pipeline/sequence_layout.split_framing) is the prefix and suffix of a source and of a label. The
decoder's start is the model's: mBART shifts labels with a wrap-around (the last label token starts the decoder,
whatever config.json says), the others start from config.json's decoder_start_token_id.

transformers is imported by the caller (the tokenizer and config come in loaded); this module only calls them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import Family
from pipeline.runtime.languages import Direction
from pipeline.runtime.model_languages import DirectionLayout, split_framing

# Any text of ordinary pieces: only what the tokenizer adds around it is read off.
PROBE = "A small dog runs across the green field."


def tokenizer_vocabulary(tokenizer: Any) -> dict[str, int]:
    """Every token the tokenizer can give, with its id: its vocabulary and added tokens, and M2M-100's language
    codes, which lie past its vocab.json and outside get_vocab()."""
    return {**tokenizer.get_vocab(), **getattr(tokenizer, "lang_token_to_id", {})}


def tokenizer_language(tokenizer: Any, code: str) -> str:
    """What `src_lang`/`tgt_lang` take for a language code: the code itself, but M2M-100 is told "de" for
    "__de__"."""
    names = {token: lang for lang, token in getattr(tokenizer, "lang_code_to_token", {}).items()}
    return names.get(code, code)


def set_direction(tokenizer: Any, family: Family, direction: Direction, codes: Mapping[str, str]) -> str:
    """Set the tokenizer to `direction`; returns the text that goes in front of each source: Marian's target tag
    and a space when the checkpoint is multi-target (`codes` then holds the targets' tags), else ""."""
    if family.sets_languages:
        tokenizer.src_lang = tokenizer_language(tokenizer, codes[direction.src])
        tokenizer.tgt_lang = tokenizer_language(tokenizer, codes[direction.tgt])
        return ""
    tag = codes.get(direction.tgt)
    return f"{tag} " if tag else ""


def encode_direction(tokenizer: Any, family: Family, direction: Direction, codes: Mapping[str, str],
                     sources: Sequence[str], targets: Sequence[str]) -> tuple[list[list[int]], list[list[int]]]:
    """(source ids, label ids) of one direction's rows: `tokenizer(sources, text_target=targets)` with the
    tokenizer set to the direction (Marian multi-target: each source led by the target's tag)."""
    lead = set_direction(tokenizer, family, direction, codes)
    encoded = tokenizer([lead + text for text in sources], text_target=list(targets))
    return encoded["input_ids"], encoded["labels"]


def decoder_start(config: Any, labels: Sequence[int], where: str) -> int:
    """The token the model's decoder starts from when it shifts `labels` right (one probe label's ids)."""
    if config.model_type == "mbart":
        # MBartForConditionalGeneration builds decoder inputs with shift_tokens_right(labels, pad): the last
        # non-pad label token wraps round to the front (mBART-cc25: the target code; mBART-50: </s>).
        return int(labels[-1])
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        raise PipelineError(f"{where}: config.json has no decoder_start_token_id, which a {config.model_type} "
                            "model starts decoding from")
    return int(start)


def measure_layout(tokenizer: Any, family: Family, config: Any, direction: Direction,
                   codes: Mapping[str, str], where: str) -> DirectionLayout:
    """Where the tokenizer, set to `direction`, puts the special ids: a probe encoded with them against its plain
    pieces, for a source and for a label; the decoder's start as the model shifts labels."""
    lead = set_direction(tokenizer, family, direction, codes)
    source = tokenizer(lead + PROBE).input_ids
    source_pieces = tokenizer(PROBE, add_special_tokens=False).input_ids
    label = tokenizer(text_target=PROBE).input_ids
    label_pieces = tokenizer(text_target=PROBE, add_special_tokens=False).input_ids
    try:
        source_prefix, source_suffix = split_framing(source, source_pieces)
        target_prefix, target_suffix = split_framing(label, label_pieces)
    except ValueError as err:
        raise PipelineError(f"{where}: the {type(tokenizer).__name__} set to {direction} does not frame a text's "
                            f"pieces with special ids alone ({err}): its layout cannot be recorded") from None
    return DirectionLayout(source_prefix, source_suffix, target_prefix, target_suffix,
                           decoder_start(config, label, where))
