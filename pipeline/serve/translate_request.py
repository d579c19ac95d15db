"""A `POST /translate` body to the lines the batcher decodes; every bad input is an ApiError naming what is wrong.

The body is read here rather than by FastAPI so that each failure gets its own message and status: a body over
--max-request-bytes (413, checked while it streams in, before it is all in memory), invalid UTF-8 (400, with the
byte and its offset), invalid JSON (400, with line and column), a missing field, a wrong type or an empty list
(422, naming the field), a string that is not valid Unicode (400: JSON's \\ud800 escapes decode to unpaired
surrogates, which no tokenizer takes), a source or target this model does not translate, or "auto" where several
sources go into the target (400, listing the model's directions), too many lines or too long a line (413, naming
the limit; a line's tokens count the special ids its direction's layout puts around it: </s>, a language code or
the target's tag).

Line breaks inside a string are kept: each line is translated on its own and the translations are joined with
"\\n", as the model was trained on sentences, not paragraphs. Blank lines stay blank without being decoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from pipeline.languages import Direction
from pipeline.serve.engine import TranslationEngine
from pipeline.serve.errors import BadRequest, InvalidFields, OverLimit
from pipeline.serve.languages import UnsupportedLanguage
from pipeline.serve.schema import TranslateRequest, json_type
from pipeline.serve.settings import ServeSettings


@dataclass(frozen=True)
class PreparedRequest:
    """The source ids of a request's lines in order (every line of every `q` item; None for a blank line), and how
    to put the translations back into the shape of `q`."""

    target: str
    sources: list[list[int] | None]
    lines_per_item: list[int]
    single: bool

    def assemble(self, translations: list[str]) -> str | list[str]:
        """translatedText: one translation per line, rejoined into the items of `q` (a string for a string)."""
        items, start = [], 0
        for count in self.lines_per_item:
            items.append("\n".join(translations[start : start + count]))
            start += count
        return items[0] if self.single else items


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over max_bytes: from Content-Length, or while it streams."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise OverLimit(f"the body is {int(declared)} bytes", "max_request_bytes", max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise OverLimit(f"the body is more than {max_bytes} bytes", "max_request_bytes", max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_body(body: bytes) -> TranslateRequest:
    if not body.strip():
        raise BadRequest('the body is empty: send a JSON object {"q": ..., "source": ..., "target": ...}')
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(
            f"the body is not valid UTF-8: byte 0x{body[err.start]:02x} at offset {err.start} ({err.reason})"
        ) from None
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRequest(f"the body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise BadRequest("the body is not usable JSON: it is nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidFields(f"the body must be a JSON object with q, source and target, not {json_type(data)}")
    try:
        return TranslateRequest.model_validate(data)
    except ValidationError as err:
        raise InvalidFields("; ".join(_field_error(e) for e in err.errors())) from None


def _field_error(error: dict[str, Any]) -> str:
    field = ".".join(str(part) for part in error["loc"])
    if error["type"] == "missing":
        return f"field {field!r} is missing"
    return f"field {field!r} {error['msg']}" if error["type"] in _OWN_MESSAGES else f"field {field!r}: {error['msg']}"


# Error types whose messages (schema.text_or_texts) read as the continuation of "field 'q' ...".
_OWN_MESSAGES = {"empty_list", "list_item_type", "text_type"}


def prepare(request: TranslateRequest, engine: TranslationEngine, settings: ServeSettings) -> PreparedRequest:
    """Languages checked, `q` split into lines, every line checked against the limits and tokenized."""
    try:
        direction = engine.languages.direction(request.source, request.target)
    except UnsupportedLanguage as err:
        raise BadRequest(str(err)) from None
    single = isinstance(request.q, str)
    items = [request.q] if single else request.q
    split = [[line.removesuffix("\r") for line in item.split("\n")] for item in items]
    lines = sum(len(item_lines) for item_lines in split)
    if lines > settings.max_lines:
        raise OverLimit(f"q has {lines} lines (line breaks inside strings count)", "max_lines",
                        settings.max_lines)
    sources: list[list[int] | None] = []
    for item, item_lines in enumerate(split):
        for number, line in enumerate(item_lines, start=1):
            sources.append(_line_ids(line, "q" if single else f"q[{item}]", number, engine, direction))
    return PreparedRequest(direction.tgt, sources, [len(s) for s in split], single)


def _line_ids(line: str, item: str, number: int, engine: TranslationEngine, direction: Direction
              ) -> list[int] | None:
    """Source ids of a line for `direction` (None when blank); errors name it as "q line 2" or "q[3] line 1"."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as err:
        raise BadRequest(
            f"{item} line {number} is not valid Unicode: an unpaired surrogate \\u{ord(line[err.start]):04x} at "
            f"character {err.start + 1}"
        ) from None
    if not line.strip():
        return None
    ids = engine.source_ids(line, direction)
    if len(ids) > engine.max_line_tokens:
        raise OverLimit(f"{item} line {number} is {len(ids)} source tokens long", "max_line_tokens",
                        engine.max_line_tokens)
    return ids
