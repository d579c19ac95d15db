"""The languages an export translates between: what `GET /languages` lists and what `source`/`target` are checked on.

They are the model's directions, from the export's `languages.json` (pipeline/runtime/model_languages.py: written
by the tokenize stage, copied with the tokenizer into models/final and models/export), as the Translator read it.
`/languages` lists each source language with its English name and the targets it goes to (LibreTranslate's shape).
A request names a direction by its `source` and `target`; `source` may be "auto" (LibreTranslate's "whatever the
text is in"): the text's language is detected among the sources that go into the target
(pipeline/runtime/serve/detect.py), and the most likely one is the direction's source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.runtime.languages import Direction, Directions, UnknownDirection
from pipeline.runtime.serve import detect
from pipeline.runtime.serve.detect import Detection
from pipeline.runtime.serve.language_names import english_name

AUTO_SOURCE = "auto"
MAX_DETECTIONS = 3


class UnsupportedLanguage(ValueError):
    """A source or target this model does not translate; the message lists the ones it does."""


@dataclass(frozen=True)
class ServedLanguages:
    directions: Directions

    def direction(self, source: str, target: str) -> Direction:
        """The direction `source` -> `target` (not "auto": see `detected`); UnsupportedLanguage, listing the
        model's directions, when the model does not translate it."""
        try:
            return self.directions.find(source, target)
        except UnknownDirection as err:
            raise UnsupportedLanguage(str(err)) from None

    def detected(self, texts: Sequence[str], target: str) -> tuple[Direction, Detection]:
        """The direction into `target` from the source `texts` are most likely in (among the sources that go into
        `target`), and that detection; UnsupportedLanguage when the model does not translate into `target`."""
        sources = self.sources_into(target)
        if not sources:
            self.direction(AUTO_SOURCE, target)  # raises: find checks the target first, and it is not the model's
        best = detect.rank(texts, sources)[0]
        return Direction(best.language, target), best

    def detections(self, texts: Sequence[str]) -> list[Detection]:
        """`POST /detect`: the model's source languages `texts` are most likely in, best first, at most
        MAX_DETECTIONS (LibreTranslate answers with its top 3)."""
        return detect.rank(texts, self.directions.sources)[:MAX_DETECTIONS]

    def sources_into(self, target: str) -> list[str]:
        return [d.src for d in self.directions.directions if d.tgt == target]

    def listing(self) -> list[dict[str, object]]:
        """LibreTranslate's `/languages` shape: one entry per source language, its English name and the targets
        it goes to."""
        return [{"code": source, "name": english_name(source),
                 "targets": [d.tgt for d in self.directions.directions if d.src == source]}
                for source in self.directions.sources]
