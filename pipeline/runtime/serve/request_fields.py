"""The fields of a `POST /translate` or `POST /detect` request, however the client sent them, as LibreTranslate reads
them: a JSON object (Content-Type application/json or application/*+json), an urlencoded form
(application/x-www-form-urlencoded: libretranslatepy), a multipart form (multipart/form-data: curl -F), or fields
in the query string (deep-translator posts them there with an empty body).

As in LibreTranslate (Flask's `request.values`), a form's fields and the query string's are read together, while
a JSON body is read alone (the query string is not looked at). A form's values are strings; a file part is read as
its field's value. A body without a Content-Type is read as JSON, as before forms were taken; an empty one leaves
the query string. Unlike LibreTranslate, which takes the first of a field given twice, a field given twice (twice
in a form, or in the form and the query string) is refused: the other value would be dropped unseen.

Every failure is an ApiError: a body over --max-request-bytes (413, checked as it streams in), a Content-Type
none of the four (415), invalid UTF-8 (400, with the byte and where), invalid JSON (400, with line and column), an
integer literal longer than Python converts (400, naming the limit), a BOM (400), a malformed multipart body (400),
a JSON value that is not an object or a field given twice (422). Standard library only.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.requests import Request

from pipeline.runtime.serve.errors import ApiError, BadRequest, InvalidFields, OverLimit
from pipeline.runtime.serve.schema import json_type

FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
JSON = "application/json"
UTF8_BOM = b"\xef\xbb\xbf"


class UnsupportedMediaType(ApiError):
    """A body of a Content-Type the service does not read (415)."""

    status = 415


class _TooManyDigits(Exception):
    def __init__(self, digits: int):
        self.digits = digits


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


@dataclass(frozen=True)
class FieldNames:
    """The fields an endpoint reads: the required ones name it in messages; a field given twice among `read` is
    refused (others are ignored anyway)."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()

    @property
    def read(self) -> frozenset[str]:
        return frozenset(self.required + self.optional)

    def __str__(self) -> str:
        *first, last = self.required
        return f"{', '.join(first)} and {last}" if first else last


async def read_fields(request: Request, max_bytes: int, names: FieldNames) -> dict[str, Any]:
    """The request's fields (see the module docstring)."""
    body = await read_body(request, max_bytes)
    return fields_of(request.headers.get("content-type"), body, request.scope.get("query_string", b""), names)


def fields_of(content_type: str | None, body: bytes, query: bytes, names: FieldNames) -> dict[str, Any]:
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type == JSON or (media_type.startswith("application/") and media_type.endswith("+json")):
        return json_fields(body, names)
    in_query = ("the query string", _urlencoded(query, "the query string"))
    if media_type == FORM:
        return _merged(names, in_query, ("the form", _urlencoded(body, "the form")))
    if media_type == MULTIPART:
        return _merged(names, in_query, ("the form", _multipart(content_type or "", body)))
    expected = str(names)
    if not body.strip():
        fields = _merged(names, in_query)
        if not fields:
            raise BadRequest(f"the request is empty: send {expected} as a JSON object, a form, or in the query "
                             "string")
        return fields
    if not media_type:
        return json_fields(body, names)
    raise UnsupportedMediaType(f"the body is {media_type}, which this service does not read: send {JSON}, {FORM} "
                               f"or {MULTIPART}")


def json_fields(body: bytes, names: FieldNames) -> dict[str, Any]:
    """The fields of a JSON body: it must be one UTF-8 JSON object."""
    if not body.strip():
        raise BadRequest(f"the body is empty: send a JSON object with {names}")
    if body.startswith(UTF8_BOM):
        raise BadRequest("the body starts with a UTF-8 byte-order mark (EF BB BF): send the JSON without it")
    text = _utf8(body, "the body")
    try:
        data: Any = json.loads(text, parse_int=_integer)
    except json.JSONDecodeError as err:
        # Some of json's messages end in "at" ("Unterminated string starting at"): the position follows them.
        where = f"line {err.lineno} column {err.colno}" if err.msg.endswith(" at") else \
            f"at line {err.lineno} column {err.colno}"
        raise BadRequest(f"the body is not valid JSON: {err.msg} {where}") from None
    except RecursionError:
        raise BadRequest("the body is not usable JSON: it is nested too deeply") from None
    except _TooManyDigits as err:
        raise BadRequest(f"the body is not usable JSON: it holds an integer of {err.digits} digits, more than the "
                         f"{sys.get_int_max_str_digits()} digits Python reads in a number") from None
    if not isinstance(data, dict):
        raise InvalidFields(f"the body must be a JSON object with {names}, not {json_type(data)}")
    return data


def _integer(digits: str) -> int:
    # json.loads would raise a plain ValueError past Python's integer-string limit (CVE-2020-10735's guard).
    limit = sys.get_int_max_str_digits()
    if limit and len(digits.lstrip("-")) > limit:
        raise _TooManyDigits(len(digits.lstrip("-")))
    return int(digits)


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(f"{what} is not valid UTF-8: byte 0x{raw[err.start]:02x} at offset {err.start} "
                         f"({err.reason})") from None


def _urlencoded(raw: bytes, where: str) -> list[tuple[str, str]]:
    """name=value pairs of an urlencoded string (a form body, a query string): '+' is a space, %XX a byte, and the
    bytes of each name and value are UTF-8."""
    pairs = []
    for item in raw.split(b"&"):
        if not item:
            continue
        name, _, value = item.partition(b"=")
        name_text = _utf8(unquote_to_bytes(name.replace(b"+", b" ")), f"a field name in {where}")
        pairs.append((name_text, _utf8(unquote_to_bytes(value.replace(b"+", b" ")),
                                       f"field {name_text!r} in {where}")))
    return pairs


def _multipart(content_type: str, body: bytes) -> list[tuple[str, str]]:
    """The (name, value) of each part of a multipart/form-data body (RFC 7578); a value's bytes are UTF-8."""
    headers = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(headers + body)
    if not message.is_multipart():
        problems = ", ".join(type(defect).__name__ for defect in message.defects) or "no parts"
        raise BadRequest(f"the body is not valid {MULTIPART} ({problems}): send the boundary in the Content-Type "
                         "and start the body with it")
    pairs = []
    for number, part in enumerate(message.iter_parts(), start=1):
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"part {number} of the {MULTIPART} body has no name: give each part a "
                             "Content-Disposition: form-data; name=\"...\" header")
        pairs.append((name, _utf8(part.get_payload(decode=True) or b"", f"field {name!r} in the form")))
    return pairs


def _merged(names: FieldNames, *sources: tuple[str, list[tuple[str, str]]]) -> dict[str, str]:
    """One dict of the fields of every source; InvalidFields naming a field read that is given more than once."""
    fields: dict[str, str] = {}
    places: dict[str, list[str]] = {}
    for where, pairs in sources:
        for name, value in pairs:
            places.setdefault(name, []).append(where)
            fields[name] = value
    for name in sorted(names.read & places.keys()):
        if len(places[name]) > 1:
            within = " and in ".join(dict.fromkeys(places[name]))
            raise InvalidFields(f"field {name!r} is given {len(places[name])} times (in {within}): give it once")
    return fields
