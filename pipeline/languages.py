"""Directions and the languages in them: what a multilingual model's rows, target tags and sampling are keyed by.

A direction is `src-tgt` in ISO 639-1/3 codes (`en-de`). One model may learn several; every row of every split
carries its own `src_lang` and `tgt_lang`. A model with more than one target language is told which one to
produce by a target tag prepended to the source (`>>de<<`, the OPUS-MT convention); a model with one target
needs none, so a bilingual model's inputs are what they were before directions existed.

Imports only numpy, so the training code can use it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DIRECTION = re.compile(r"^([a-z]{2,3})-([a-z]{2,3})$")


@dataclass(frozen=True, order=True)
class Direction:
    src: str
    tgt: str

    @classmethod
    def parse(cls, text: str) -> Direction:
        match = DIRECTION.match(text)
        if not match:
            raise ValueError(f"direction {text!r} is not 'src-tgt' in ISO language codes (e.g. 'en-de')")
        src, tgt = match.groups()
        if src == tgt:
            raise ValueError(f"direction {text!r} translates {src!r} into itself")
        return cls(src, tgt)

    def __str__(self) -> str:
        return f"{self.src}-{self.tgt}"


def target_tag(lang: str) -> str:
    """The source-side token that asks a multi-target model for `lang` (a reserved piece, never split)."""
    return f">>{lang}<<"


def target_languages(directions: Sequence[Direction]) -> list[str]:
    return sorted({d.tgt for d in directions})


def needs_target_tags(directions: Sequence[Direction]) -> bool:
    """Only a model with several target languages must be told which one: a bilingual model's inputs stay as
    they were, so its vocabulary, ids and checkpoints do not change."""
    return len(target_languages(directions)) > 1


def languages_of(directions: Sequence[Direction]) -> list[str]:
    """Every language on either side, sorted."""
    return sorted({lang for d in directions for lang in (d.src, d.tgt)})


def temperature_weights(sizes: Sequence[int], temperature: float) -> np.ndarray:
    """Sampling probabilities p_i proportional to (n_i / N) ** (1 / T) (fairseq's multilingual sampling).

    T = 1 samples in proportion to the data; a larger T flattens towards uniform, so small directions are seen
    more often than their share. A direction with no rows gets probability 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    counts = np.asarray(sizes, dtype=np.float64)
    if counts.sum() <= 0:
        raise ValueError("no rows in any direction")
    shares = counts / counts.sum()
    weights = np.where(counts > 0, shares ** (1.0 / temperature), 0.0)
    return weights / weights.sum()
