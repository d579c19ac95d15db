"""A request's fields to the lines the batcher decodes, and their translations to the answer; every bad input is an
ApiError naming what is wrong.

The fields come from pipeline/runtime/serve/request_fields.py (JSON, a form or the query string; its failures are listed
there). Here: a missing field, a wrong type or an empty list (422, naming the field), `alternatives` past what the
beam gives (422, naming the flag that widens it), a string that is not valid Unicode (400: JSON's \\ud800 escapes
decode to unpaired surrogates, which no tokenizer takes; the message writes the escape, never the character), an
HTML document that is not well nested (400, naming the tags, their line and column:
pipeline/runtime/serve/html_text.py), a source or target this model does not translate (400, listing the model's
directions), too many lines or too long a line (413, naming the limit; a line's tokens count the special ids its
direction's layout puts around it: </s>, a language code or the target's tag).

Line breaks inside a string are kept: each line is translated on its own and the translations are joined with
"\\n", as the model was trained on sentences, not paragraphs. Blank lines stay blank without being decoded. With
`format: "html"` the lines are the document's text nodes, and the translations go back into the document.
With `source: "auto"` each item of `q` is detected on its own (its text, or its text nodes), among the sources
that go into the target, and translated from the language found; the answer's detectedLanguage says which.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.runtime.languages import Direction
from pipeline.runtime.serve import html_text
from pipeline.runtime.serve.detect import Detection
from pipeline.runtime.serve.engine import TranslationEngine, alternatives_of
from pipeline.runtime.serve.errors import BadRequest, InvalidFields, OverLimit
from pipeline.runtime.serve.languages import AUTO_SOURCE, UnsupportedLanguage
from pipeline.runtime.serve.request_fields import FieldNames, json_fields
from pipeline.runtime.serve.schema import DetectRequest, TranslateRequest
from pipeline.runtime.serve.settings import ServeSettings, flag

TRANSLATE_FIELDS = FieldNames(("q", "source", "target"), ("format", "alternatives", "api_key"))
DETECT_FIELDS = FieldNames(("q",), ("api_key",))


# --------------------------------------------------------------------------------------------------- fields


def parse_body(body: bytes) -> TranslateRequest:
    """A JSON body's TranslateRequest."""
    return parse_fields(json_fields(body, TRANSLATE_FIELDS))


def parse_fields(fields: dict[str, Any]) -> TranslateRequest:
    return _validated(TranslateRequest, fields, ("source", "target", "format", "api_key"))


def parse_detect_fields(fields: dict[str, Any]) -> DetectRequest:
    return _validated(DetectRequest, fields, ("api_key",))


def _validated(model: type[BaseModel], fields: dict[str, Any], strings: Iterable[str]) -> Any:
    """`fields` as `model`; its string fields other than q must be valid Unicode (q's lines are checked with
    their own names)."""
    for name in strings:
        if isinstance(fields.get(name), str):
            _check_unicode(fields[name], f"field {name!r}")
    try:
        return model.model_validate(fields)
    except ValidationError as err:
        raise InvalidFields("; ".join(_field_error(e) for e in err.errors())) from None


def _field_error(error: Any) -> str:
    name = ".".join(str(part) for part in error["loc"])
    if error["type"] == "missing":
        return f"field {name!r} is missing"
    return f"field {name!r} {error['msg']}" if error["type"] in _OWN_MESSAGES else f"field {name!r}: {error['msg']}"


# Error types whose messages (schema.text_or_texts, schema.whole_number) read as the continuation of "field 'q' ...".
_OWN_MESSAGES = {"empty_list", "list_item_type", "text_type", "whole_number"}


def _check_unicode(text: str, what: str, *, lines: bool = False) -> None:
    """BadRequest naming the first unpaired surrogate in `text` by its escape and position (character, or line and
    column with `lines`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        escape = f"\\u{ord(text[err.start]):04x}"
        if lines:
            before = text[: err.start]
            where = f"line {before.count(chr(10)) + 1} column {err.start - before.rfind(chr(10))}"
        else:
            where = f"character {err.start + 1}"
        raise BadRequest(f"{what} is not valid Unicode: an unpaired surrogate {escape} at {where}") from None


# --------------------------------------------------------------------------------------------------- items


@dataclass(frozen=True)
class TextItem:
    """A plain-text item of `q`: its lines, translated one by one and joined with "\\n"."""

    lines: list[str]

    @property
    def texts(self) -> list[str]:
        return self.lines

    def where(self, item: str, index: int) -> str:
        return f"{item} line {index + 1}"

    def rebuild(self, translations: list[str]) -> str:
        return "\n".join(translations)

    def alternatives(self, translations: list[str], count: int) -> list[str]:
        """Up to `count` other distinct texts of the item: the k-th takes each line's k-th alternative (its best
        where it has fewer)."""
        options = [alternatives_of(t) for t in translations]
        best = self.rebuild(translations)
        found: list[str] = []
        for k in range(max((len(o) for o in options), default=0)):
            text = self.rebuild([o[k] if k < len(o) else t for o, t in zip(options, translations, strict=True)])
            if text != best and text not in found:
                found.append(text)
        return found[:count]


@dataclass(frozen=True)
class HtmlItem:
    """An HTML item of `q`: its text nodes, translated one by one and put back into its markup."""

    document: html_text.HtmlDocument

    @property
    def texts(self) -> list[str]:
        return self.document.texts

    def where(self, item: str, index: int) -> str:
        node = self.document.nodes[index]
        return f"{item} text at line {node.line} column {node.column}"

    def rebuild(self, translations: list[str]) -> str:
        return self.document.with_translations(translations)

    def alternatives(self, translations: list[str], count: int) -> list[str]:
        return []  # as LibreTranslate: alternatives are not given for html


def _items(request: TranslateRequest) -> list[TextItem | HtmlItem]:
    single = isinstance(request.q, str)
    items = [request.q] if single else request.q
    names = ["q"] if single else [f"q[{i}]" for i in range(len(items))]
    if request.format == "text":
        split = [[line.removesuffix("\r") for line in item.split("\n")] for item in items]
        for name, lines in zip(names, split, strict=True):
            for number, line in enumerate(lines, start=1):
                _check_unicode(line, f"{name} line {number}")
        return [TextItem(lines) for lines in split]
    parsed: list[TextItem | HtmlItem] = []
    for name, item in zip(names, items, strict=True):
        _check_unicode(item, name, lines=True)
        try:
            parsed.append(HtmlItem(html_text.parse(item)))
        except html_text.HtmlError as err:
            raise BadRequest(f"{name} is not well-formed HTML: {err}") from None
    return parsed


# --------------------------------------------------------------------------------------------------- prepared


@dataclass(frozen=True)
class PreparedRequest:
    """The source ids of a request's lines in order (every line of every `q` item; None for a blank line), and how
    to put the translations back into the shape of `q`, with what the request asked for besides."""

    target: str
    sources: list[list[int] | None]
    items: list[TextItem | HtmlItem]
    single: bool
    detected: list[Detection] | None = None  # per item, for source "auto"
    alternatives: int = 0

    def _per_item(self, translations: list[str]) -> list[list[str]]:
        """The translations of each item's lines."""
        per_item, start = [], 0
        for item in self.items:
            per_item.append(translations[start : start + len(item.texts)])
            start += len(item.texts)
        return per_item

    def assemble(self, translations: list[str]) -> str | list[str]:
        """translatedText: one translation per line, rebuilt into the items of `q` (a string for a string)."""
        texts = [item.rebuild(lines) for item, lines in zip(self.items, self._per_item(translations), strict=True)]
        return texts[0] if self.single else texts

    def response(self, translations: list[str]) -> dict[str, Any]:
        """The answer: translatedText, then detectedLanguage for "auto" and alternatives when asked for, each a
        list for a list `q` (LibreTranslate's shape)."""
        answer: dict[str, Any] = {"translatedText": self.assemble(translations)}
        if self.detected is not None:
            detected = [d.to_json() for d in self.detected]
            answer["detectedLanguage"] = detected[0] if self.single else detected
        if self.alternatives:
            options = [item.alternatives(lines, self.alternatives)
                       for item, lines in zip(self.items, self._per_item(translations), strict=True)]
            answer["alternatives"] = options[0] if self.single else options
        return answer


def prepare(request: TranslateRequest, engine: TranslationEngine, settings: ServeSettings) -> PreparedRequest:
    """Languages checked (or detected), `q` split into lines (or text nodes), every line checked against the limits
    and tokenized."""
    if request.alternatives:
        _check_alternatives(request.alternatives, engine.beam)
    items = _items(request)
    directions, detected = _directions(request, items, engine)
    lines = sum(len(item.texts) for item in items)
    if lines > settings.max_lines:
        what = "text nodes to translate" if request.format == "html" else "lines (line breaks inside strings count)"
        raise OverLimit(f"q has {lines} {what}", "max_lines", settings.max_lines)
    single = isinstance(request.q, str)
    sources: list[list[int] | None] = []
    for index, (item, direction) in enumerate(zip(items, directions, strict=True)):
        name = "q" if single else f"q[{index}]"
        sources.extend(_line_ids(text, item.where(name, number), engine, direction)
                       for number, text in enumerate(item.texts))
    return PreparedRequest(request.target, sources, items, single, detected, request.alternatives)


def _check_alternatives(count: int, beam: int) -> None:
    if count > beam - 1:
        raise InvalidFields(f"field 'alternatives' is {count}, more than the {beam - 1} other hypotheses this "
                            f"service's beam of {beam} keeps: ask for at most {beam - 1}, or start the service with "
                            f"{flag('beam')} {count + 1}")


def _directions(request: TranslateRequest, items: list[TextItem | HtmlItem], engine: TranslationEngine
                ) -> tuple[list[Direction], list[Detection] | None]:
    """Each item's direction; with source "auto", detected per item (and the detections)."""
    try:
        if request.source != AUTO_SOURCE:
            return [engine.languages.direction(request.source, request.target)] * len(items), None
        found = [engine.languages.detected(item.texts, request.target) for item in items]
    except UnsupportedLanguage as err:
        raise BadRequest(str(err)) from None
    return [direction for direction, _ in found], [detection for _, detection in found]


def _line_ids(line: str, where: str, engine: TranslationEngine, direction: Direction) -> list[int] | None:
    """Source ids of a line for `direction` (None when blank); errors name it as "q line 2" or "q[3] line 1"."""
    if not line.strip():
        return None
    ids = engine.source_ids(line, direction)
    if len(ids) > engine.max_line_tokens:
        raise OverLimit(f"{where} is {len(ids)} source tokens long", "max_line_tokens", engine.max_line_tokens)
    return ids


# --------------------------------------------------------------------------------------------------- detect


def detections(request: DetectRequest, engine: TranslationEngine, settings: ServeSettings) -> list[dict[str, Any]]:
    """`POST /detect`'s answer: the model's sources `q` is most likely in, best first (q's lines count against
    --max-lines, as a translation's do)."""
    texts = [request.q] if isinstance(request.q, str) else request.q
    for index, text in enumerate(texts):
        _check_unicode(text, "q" if isinstance(request.q, str) else f"q[{index}]", lines=True)
    lines = sum(text.count("\n") + 1 for text in texts)
    if lines > settings.max_lines:
        raise OverLimit(f"q has {lines} lines (line breaks inside strings count)", "max_lines", settings.max_lines)
    return [detection.to_json() for detection in engine.languages.detections(texts)]
