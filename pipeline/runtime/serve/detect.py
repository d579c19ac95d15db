"""Which of a model's source languages a text is in: `POST /detect` and `"source": "auto"`.

The identifier is py3langid, the one the clean stage filters with (pipeline.text_checks), here with normalised
probabilities over all of its languages: a language's confidence is py3langid's probability for it, in percent
(LibreTranslate's scale, 0-100), so a text in a language the model does not read gets a low confidence for every
source instead of 100 for the least unlikely one. The candidates are the model's sources (for a translation, the
sources that go into the target); a source py3langid does not know has confidence 0 and is chosen only when it is
the only candidate. A list of texts is detected as one text: each language's confidence is the mean of its
confidence in each text, weighted by the text's length (LibreTranslate averages a batch's candidates too).
Detecting takes ~40 µs a sentence, so it runs on the request's thread; the model loads (~1 s) once a process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Detection:
    language: str
    confidence: float  # percent, 0-100

    def to_json(self) -> dict[str, object]:
        return {"confidence": self.confidence, "language": self.language}


@functools.lru_cache(maxsize=1)
def _identifier() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def load() -> None:
    """Load the identifier now (a service does it at start, so that its first request does not wait for it)."""
    _identifier()


def _probabilities(text: str) -> dict[str, float]:
    return dict(_identifier().rank(text))


def rank(texts: Sequence[str], candidates: Sequence[str]) -> list[Detection]:
    """The candidates by how likely `texts` (taken together) are in each, most likely first; ties keep the
    candidates' order."""
    if not candidates:
        raise ValueError("rank needs at least one candidate language")
    weights = [max(len(text), 1) for text in texts]
    totals = dict.fromkeys(candidates, 0.0)
    for text, weight in zip(texts, weights, strict=True):
        probabilities = _probabilities(text)
        for language in candidates:
            totals[language] += weight * probabilities.get(language, 0.0)
    whole = sum(weights) or 1
    ranked = sorted(candidates, key=lambda language: -totals[language])
    return [Detection(language, round(100 * totals[language] / whole, 2)) for language in ranked]
