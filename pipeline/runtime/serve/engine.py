"""The exported model as the service uses it: a `Translator` whose work is split in two halves.

The request handler tokenizes (microseconds a line) so that it can refuse a line over the token limit and so that
the batcher can count tokens; a worker thread decodes a batch of ids (milliseconds to seconds) and turns the
hypotheses into text. `Translator.translate` does both in one call; here they are apart, through the
Translator's `source_ids` and `translate_ids`, and the text of a hypothesis follows `Translator.translate`'s rule
(a hypothesis is one line of text).

A line is tokenized for its request's direction (its layout: the Marian target tag, or the source's language
code). The batcher keeps a batch to one target, and a batch is decoded after that target's decoder prefix (the
start token, then the target's code where the family has one), which every direction into the target shares:
`load` checks it, so a batch may mix the sources of several directions into one target.

One Translator serves every worker: its ONNX Runtime sessions run concurrent calls, each on one thread (the
Translator is built with threads=1, so each call decodes its batch on the calling thread only).

A line's translation is a `Translation`: the best hypothesis's text, which is what the batcher hands back, and
the beam's other hypotheses, decoded to text only when a request asks for `alternatives`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pipeline.runtime.decoding import one_line
from pipeline.runtime.export_format import ExportDirError
from pipeline.runtime.languages import Direction
from pipeline.runtime.serve import detect
from pipeline.runtime.serve.languages import ServedLanguages
from pipeline.runtime.serve.settings import ServeSettings, SettingsError, flag

if TYPE_CHECKING:
    from pipeline.runtime.translate import Translator


class Translation(str):
    """A line's best translation (the string itself) and the text of the beam's other hypotheses, best first."""

    def __new__(cls, best: str, others: Sequence[Sequence[int]] = (),
                decode: Callable[[Sequence[int]], str] | None = None) -> Translation:
        translation = super().__new__(cls, best)
        translation._others, translation._decode = others, decode
        return translation

    @property
    def alternatives(self) -> list[str]:
        """The other hypotheses' text (decoded now: most requests never ask for it)."""
        return [one_line(self._decode(ids)) for ids in self._others] if self._decode else []


def alternatives_of(translation: str) -> list[str]:
    """The beam's other translations of a line (none for a blank line, which is not decoded)."""
    return translation.alternatives if isinstance(translation, Translation) else []


class TranslationEngine:
    def __init__(self, translator: Translator, languages: ServedLanguages, beam: int, max_line_tokens: int):
        self.translator = translator
        self.languages = languages
        self.beam = beam
        self.max_line_tokens = max_line_tokens

    @classmethod
    def load(cls, settings: ServeSettings) -> TranslationEngine:
        """The export of settings.model_dir, fp32 or int8; ExportDirError when it is not a usable export."""
        from pipeline.runtime.translate import Translator

        translator = Translator(settings.model_dir, int8=settings.int8, threads=1)
        languages = ServedLanguages(translator.directions)
        positions = translator.max_input_tokens
        if settings.max_line_tokens is not None and settings.max_line_tokens > positions:
            raise SettingsError(
                f"{flag('max_line_tokens')} {settings.max_line_tokens} is more than the {positions} source "
                f"tokens the model in {settings.model_dir} takes"
            )
        beam = settings.beam if settings.beam is not None else translator.manifest.generation.beam
        for target in translator.directions.targets:
            into = [d for d in translator.directions.directions if d.tgt == target]
            prefixes = {translator.layout(d).decoder_prefix for d in into}
            if len(prefixes) > 1:  # no family does this: its languages.json would be wrong
                raise ExportDirError(f"{settings.model_dir}: the directions into {target!r} "
                                     f"({', '.join(map(str, into))}) start decoding from different prefixes "
                                     f"{sorted(prefixes)}: a batch into {target!r} could not be decoded together")
        detect.load()  # for "auto" and /detect, now rather than in the first such request
        return cls(translator, languages, beam, settings.max_line_tokens or positions)

    @property
    def model_dir(self) -> str:
        return str(self.translator.model_dir)

    def source_ids(self, line: str, direction: Direction) -> list[int]:
        """The line's source ids for `direction` (tag first where the model's targets are tagged), </s> included,
        untruncated (the caller checks them against max_line_tokens)."""
        return self.translator.source_ids(line, direction)

    def translate(self, sources: Sequence[Sequence[int]], target: str) -> list[Translation]:
        """Each source's translation into `target` (the sources were tokenized for it), in order. Runs on a worker
        thread."""
        into = [d for d in self.languages.directions.directions if d.tgt == target]
        if not into:  # the request handler checked it
            raise ValueError(f"target {target!r} is not one of {self.languages.directions.targets}")
        # Every direction into the target has the same decoder prefix (load checked it).
        nbest = self.translator.hypotheses_ids(sources, beam=self.beam, direction=into[0])
        decode = self.translator.tokenizer.decode
        return [Translation(one_line(decode(hypotheses[0])), hypotheses[1:], decode) for hypotheses in nbest]
