"""The languages an export translates between: what `GET /languages` lists and what `source`/`target` are checked on.

They are the model's directions, from the export's `languages.json` (pipeline/languages.py: written by the tokenize
stage, copied with the tokenizer into models/final and models/export; the Translator reads it and checks it against
the manifest). `/languages` lists each source language with the targets it goes to (LibreTranslate's shape). A
request names a direction by its `source` and `target`; `source` may be "auto" (LibreTranslate's "whatever the text
is in") only where that leaves no choice: one source language goes into the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.languages import Direction, Directions, UnknownDirection

AUTO_SOURCE = "auto"


class UnsupportedLanguage(ValueError):
    """A source or target this model does not translate; the message lists the ones it does."""


@dataclass(frozen=True)
class ModelLanguages:
    directions: Directions

    def direction(self, source: str, target: str) -> Direction:
        """The direction `source` (or "auto") -> `target`; UnsupportedLanguage, listing the model's directions,
        when the model does not translate it or "auto" could mean several sources."""
        auto = source == AUTO_SOURCE
        try:
            return self.directions.find(None if auto else source, target)
        except UnknownDirection as err:
            ambiguous = auto and target in self.directions.targets  # the target is fine: "auto" is what failed
            raise UnsupportedLanguage(f"source {AUTO_SOURCE!r}: {err}" if ambiguous else str(err)) from None

    def listing(self) -> list[dict[str, object]]:
        """LibreTranslate's `/languages` shape: one entry per source language with the targets it goes to.
        The export records codes only, so a language's name is its code."""
        return [{"code": source, "name": source,
                 "targets": [d.tgt for d in self.directions.directions if d.src == source]}
                for source in self.directions.sources]
