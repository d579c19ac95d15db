"""Directions and languages: what `data.directions` names, the target tags, temperature sampling shares.

Stdlib only: params.py checks the directions with it, and `mtpipe translate` and the server read a model's
directions with it (a model records them in its languages.json: pipeline/runtime/model_languages.py), none of them
importing anything heavy.

With more than one target language every source sentence starts with the target's tag, `>>de<<` (the OPUS-MT
multi-target convention): a reserved SentencePiece piece, never split, which MarianTokenizer keeps as one token.
With one target language there is no tag, so a single-direction model is exactly what it was before directions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DIRECTION_PATTERN = r"^[a-z]{2,3}-[a-z]{2,3}$"
_DIRECTION = re.compile(DIRECTION_PATTERN)

# The script of a language's letters, as an RE2 class body (the clean stage's wrong_script filter and the
# validate suite measure each side's letters in its language's script). A language missing here cannot be
# script-checked: params.py refuses it while clean.min_script_share is on, naming it.
SCRIPTS = {
    **dict.fromkeys(
        "af br ca cs cy da de en eo es et eu fi fr ga gl hr hu id is it lt lv ms mt nl no pl pt ro sk sl sq sv sw "
        "tl tr vi".split(),
        r"\p{Latin}",
    ),
    **dict.fromkeys("be bg kk mk ru uk".split(), r"\p{Cyrillic}"),
    **dict.fromkeys("hi mr ne".split(), r"\p{Devanagari}"),
    **dict.fromkeys("ar fa ps ur".split(), r"\p{Arabic}"),
    "el": r"\p{Greek}",
    "he": r"\p{Hebrew}",
    "zh": r"\p{Han}",
    "ja": r"\p{Han}\p{Hiragana}\p{Katakana}",
    "ko": r"\p{Hangul}\p{Han}",
    "th": r"\p{Thai}",
    "ka": r"\p{Georgian}",
    "hy": r"\p{Armenian}",
}


# A tokenized corpus stores each row's direction in one byte (uint8, pipeline/token_arrays.py).
MAX_DIRECTIONS = 256


class UnknownDirection(ValueError):
    """A direction or target language the model does not translate; the message lists the ones it does."""


@dataclass(frozen=True, order=True)
class Direction:
    src: str
    tgt: str

    @classmethod
    def parse(cls, text: str) -> Direction:
        if not isinstance(text, str) or not _DIRECTION.match(text):
            raise ValueError(f"{text!r} is not a direction: write source-target language codes, e.g. en-de")
        src, tgt = text.split("-")
        if src == tgt:
            raise ValueError(f"{text!r}: source and target are the same language")
        return cls(src, tgt)

    def __str__(self) -> str:
        return f"{self.src}-{self.tgt}"


def target_tag(lang: str) -> str:
    """The source-side token that asks for `lang` (OPUS-MT's multi-target convention)."""
    return f">>{lang}<<"


@dataclass(frozen=True)
class Directions:
    """The directions one model translates, in params order."""

    directions: tuple[Direction, ...]

    @classmethod
    def of(cls, names: Iterable[str | Direction]) -> Directions:
        return cls(tuple(d if isinstance(d, Direction) else Direction.parse(d) for d in names))

    @property
    def names(self) -> list[str]:
        return [str(d) for d in self.directions]

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(d.src for d in self.directions))

    @property
    def targets(self) -> list[str]:
        return list(dict.fromkeys(d.tgt for d in self.directions))

    @property
    def languages(self) -> list[str]:
        return list(dict.fromkeys(lang for d in self.directions for lang in (d.src, d.tgt)))

    @property
    def target_tags(self) -> bool:
        """Sources carry the target's tag only when there is a choice of target."""
        return len(self.targets) > 1

    @property
    def tags(self) -> list[str]:
        """The reserved tag pieces, one per target language; none for a single target."""
        return [target_tag(t) for t in self.targets] if self.target_tags else []

    def tagged(self, text: str, tgt: str) -> str:
        """`text` as the model reads it when asked for `tgt`: with the tag in front when targets are tagged."""
        return f"{target_tag(tgt)} {text}" if self.target_tags else text

    def find(self, src: str | None, tgt: str | None) -> Direction:
        """The direction asked for; `src`/`tgt` may be None where the model leaves no choice. UnknownDirection
        (listing the model's directions) for a pair it does not translate or a choice it cannot make."""
        listing = ", ".join(self.names)
        if tgt is None:
            if len(self.targets) > 1:
                raise UnknownDirection(f"this model translates into {', '.join(self.targets)}: name the target "
                                       f"language (directions: {listing})")
            tgt = self.targets[0]
        if tgt not in self.targets:
            raise UnknownDirection(f"target {tgt!r} is not one of this model's targets: {', '.join(self.targets)} "
                                   f"(directions: {listing})")
        sources = [d.src for d in self.directions if d.tgt == tgt]
        if src is None:
            if len(sources) > 1:
                raise UnknownDirection(f"this model translates into {tgt} from {', '.join(sources)}: name the "
                                       f"source language (directions: {listing})")
            src = sources[0]
        if src not in sources:
            raise UnknownDirection(f"this model does not translate {src}-{tgt}; its directions: {listing}")
        return Direction(src, tgt)


def temperature_shares(sizes: Mapping[str, int], temperature: float) -> dict[str, float]:
    """Sampling share of each group (a direction, a language) from its size: p ∝ (n / N) ** (1 / T).

    T = 1 samples in proportion to the data; a larger T flattens towards uniform (fairseq's
    translation_multi_simple_epoch, XLM/mBART's language sampling). Empty groups get 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    total = sum(sizes.values())
    if total <= 0:
        raise ValueError("every group is empty")
    weights = {k: (n / total) ** (1.0 / temperature) if n > 0 else 0.0 for k, n in sizes.items()}
    norm = sum(weights.values())
    return {k: w / norm for k, w in weights.items()}
