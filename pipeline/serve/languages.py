"""The languages an export translates between: what `GET /languages` lists and what `source`/`target` are checked on.

A model has one source language and a list of targets. Today's exports are single-direction: the pair is the
MarianTokenizer's `source_lang`/`target_lang` in the export's tokenizer_config.json (the tokenize stage writes
them from data.src_lang/data.tgt_lang). A multi-target export lists more targets; everything here already takes
a list, so only `ModelLanguages.of_export` has to learn where that list is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.export_format import ExportDirError, read_export_json

TOKENIZER_CONFIG = "tokenizer_config.json"
# LibreTranslate's value for "whatever the text is in"; a model with one source language can only mean that one.
AUTO_SOURCE = "auto"


class UnsupportedLanguage(ValueError):
    """A source or target this model does not translate; the message lists the ones it does."""


@dataclass(frozen=True)
class ModelLanguages:
    source: str
    targets: tuple[str, ...]

    @classmethod
    def of_export(cls, model_dir: Path) -> ModelLanguages:
        path = Path(model_dir) / TOKENIZER_CONFIG
        config = read_export_json(path)
        source, target = config.get("source_lang"), config.get("target_lang")
        if not isinstance(source, str) or not isinstance(target, str) or not source or not target:
            raise ExportDirError(
                f"{path} names no language pair (source_lang {source!r}, target_lang {target!r}): "
                "export it again (`dvc repro tokenize train export`)"
            )
        return cls(source=source, targets=(target,))

    def check(self, source: str, target: str) -> None:
        """UnsupportedLanguage unless this model translates `source` (or "auto") into `target`."""
        if source not in (self.source, AUTO_SOURCE):
            raise UnsupportedLanguage(
                f"source {source!r} is not this model's source language: use {self.source!r} (or {AUTO_SOURCE!r})"
            )
        if target not in self.targets:
            raise UnsupportedLanguage(
                f"target {target!r} is not one of this model's targets: {', '.join(map(repr, self.targets))}"
            )

    def listing(self) -> list[dict[str, object]]:
        """LibreTranslate's `/languages` shape: one entry per source language with the targets it goes to.
        The export records codes only, so a language's name is its code."""
        return [{"code": self.source, "name": self.source, "targets": list(self.targets)}]
