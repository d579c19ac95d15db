"""The CTranslate2 model directory (`export.ctranslate2`, the optional `ct2` dependencies): converting the trained
model, and decoding with it the way the other runtimes' outputs are compared.

CTranslate2 drops the last embedding row (<pad>) and starts decoding from a zero vector, which matches the trained
model because training keeps the <pad> row at zero (see stages/train/loop.py). A multi-target model's `>>fr<<` tags
are source tokens of its vocabulary (Marian's convention), so the conversion is the same and a tagged source is
translated as given (no target_prefix).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

from pipeline.errors import OptionalDependencyMissing

log = logging.getLogger("mtpipe.export")


def _missing() -> OptionalDependencyMissing:
    return OptionalDependencyMissing("ctranslate2", "export.ctranslate2 is true", "pip install 'mtpipe[ct2]'")


def require_ctranslate2() -> None:
    """Raise OptionalDependencyMissing, naming the extra, unless ctranslate2 is installed (checked without
    importing it, so the stage fails before minutes of export, not after)."""
    if importlib.util.find_spec("ctranslate2") is None:
        raise _missing()


def convert_ctranslate2(final_model: Path, out: Path, quantization: str) -> float:
    """A CTranslate2 model directory `out` converted from the save_pretrained directory; returns seconds."""
    try:
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        raise _missing() from None
    log.info("converting to CTranslate2 (%s)", quantization)
    start = time.perf_counter()
    TransformersConverter(str(final_model)).convert(str(out), quantization=quantization)
    return round(time.perf_counter() - start, 2)


def max_decoding_length(output_limit: int) -> int:
    """CTranslate2's max_decoding_length for a pipeline.decoding.output_limit: the limit counts a forced </s>,
    CTranslate2 stops after max_decoding_length tokens without one."""
    return max(output_limit - 1, 1)


def greedy_ids(translator: Any, tokenizer: Any, sources: list[list[int]], output_limit: int, eos_id: int
               ) -> list[list[int]]:
    """CTranslate2 greedy outputs as ids ending in </s>, like the other runtimes' (it returns no end token)."""
    tokens = [tokenizer.convert_ids_to_tokens(s) for s in sources]
    results = translator.translate_batch(tokens, beam_size=1, max_decoding_length=max_decoding_length(output_limit))
    return [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) + [eos_id] for r in results]
