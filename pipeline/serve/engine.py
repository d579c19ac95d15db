"""The exported model as the service uses it: a `Translator` whose work is split in two halves.

The request handler tokenizes (microseconds a line) so that it can refuse a line over the token limit and so that
the batcher can count tokens; a worker thread decodes a batch of ids (milliseconds to seconds) and turns the
hypotheses into text. `Translator.translate` does both in one call; here they are apart, through the
Translator's tokenizer (`MarianSentencePiece`) and `translate_ids`, and the text of a hypothesis follows
`Translator.translate`'s rule (a hypothesis is one line of text).

A line is tokenized for its request's direction: with several target languages its ids start with the target's
tag, so the graphs need nothing else to know the target (the batcher still keeps a batch to one target, which
keeps a batch's rows alike).

One Translator serves every worker: its ONNX Runtime sessions run concurrent calls, each on one thread (the
Translator is built with threads=1, so each call decodes its batch on the calling thread only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeline.decoding import one_line
from pipeline.languages import Direction
from pipeline.serve.languages import ModelLanguages
from pipeline.serve.settings import ServeSettings, SettingsError, flag

if TYPE_CHECKING:
    from pipeline.translate import Translator


class TranslationEngine:
    def __init__(self, translator: Translator, languages: ModelLanguages, beam: int, max_line_tokens: int):
        self.translator = translator
        self.languages = languages
        self.beam = beam
        self.max_line_tokens = max_line_tokens

    @classmethod
    def load(cls, settings: ServeSettings) -> TranslationEngine:
        """The export of settings.model_dir, fp32 or int8; ExportDirError when it is not a usable export."""
        from pipeline.translate import Translator

        translator = Translator(settings.model_dir, int8=settings.int8, threads=1)
        languages = ModelLanguages(translator.directions)
        positions = translator.max_input_tokens
        if settings.max_line_tokens is not None and settings.max_line_tokens > positions:
            raise SettingsError(
                f"{flag('max_line_tokens')} {settings.max_line_tokens} is more than the {positions} source "
                f"tokens the model in {settings.model_dir} takes"
            )
        beam = settings.beam if settings.beam is not None else translator.manifest.generation.beam
        return cls(translator, languages, beam, settings.max_line_tokens or positions)

    @property
    def model_dir(self) -> str:
        return str(self.translator.model_dir)

    def source_ids(self, line: str, direction: Direction) -> list[int]:
        """The line's source ids for `direction` (tag first where the model's targets are tagged), </s> included,
        untruncated (the caller checks them against max_line_tokens)."""
        return self.translator.source_ids(line, direction)

    def translate(self, sources: Sequence[Sequence[int]], target: str) -> list[str]:
        """Text of each source's translation into `target` (the sources were tokenized for it), in order. Runs on
        a worker thread."""
        targets = self.languages.directions.targets
        if target not in targets:  # the request handler checked it
            raise ValueError(f"target {target!r} is not one of {targets}")
        hypotheses = self.translator.translate_ids(sources, beam=self.beam)
        decode = self.translator.tokenizer.decode
        return [one_line(decode(hypothesis)) for hypothesis in hypotheses]
