"""pipeline/runtime/serve/request_fields.py and the fields' validation: a request's fields read the same from a JSON
body, an urlencoded form, a multipart form and the query string, as LibreTranslate reads them; every malformed body gets
a 4xx naming the problem (never a 500: an integer past Python's digit limit, a lone surrogate), and `/languages`
names each language in English."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
import requests

from pipeline.runtime.languages import Directions
from pipeline.runtime.serve.errors import ApiError, BadRequest, InvalidFields, OverLimit
from pipeline.runtime.serve.languages import ServedLanguages
from pipeline.runtime.serve.request_fields import UnsupportedMediaType, fields_of
from pipeline.runtime.serve.schema import TranslateRequest
from pipeline.runtime.serve.settings import ServeSettings
from pipeline.runtime.serve.translate_request import TRANSLATE_FIELDS, parse_fields, prepare

FIELDS = {"q": "A dog.", "source": "en", "target": "de"}


def read(content_type: str | None, body: bytes = b"", query: bytes = b"") -> dict:
    return fields_of(content_type, body, query, TRANSLATE_FIELDS)


def multipart(fields: dict[str, str]) -> tuple[str, bytes]:
    """A multipart/form-data body as requests (and curl -F) write it."""
    prepared = requests.Request("POST", "http://x/", files={k: (None, v) for k, v in fields.items()}).prepare()
    return prepared.headers["Content-Type"], prepared.body


def refused(content_type: str | None, body: bytes = b"", query: bytes = b"") -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_fields(read(content_type, body, query))
    return caught.value


# --------------------------------------------------------------------------------------------------- encodings


def test_a_form_encoded_body_translates_like_json():
    as_json = read("application/json", json.dumps(FIELDS).encode())
    as_form = read("application/x-www-form-urlencoded", urlencode(FIELDS).encode())
    assert as_form == as_json == FIELDS
    assert parse_fields(as_form) == parse_fields(as_json)


def test_a_multipart_form_and_fields_in_the_query_string_with_an_empty_body_read_the_same():
    content_type, body = multipart({"q": "Hé\r\nllo", "source": "en", "target": "de"})
    assert read(content_type, body) == {"q": "Hé\r\nllo", "source": "en", "target": "de"}
    # deep-translator: requests.post(url, params=...) sends no Content-Type and no body.
    assert read(None, b"", urlencode(FIELDS).encode()) == FIELDS


def test_a_form_and_the_query_string_are_read_together_and_a_json_body_alone():
    query = urlencode({"target": "de", "api_key": "k"}).encode()
    assert read("application/x-www-form-urlencoded", b"q=A+dog.&source=en", query) == {**FIELDS, "api_key": "k"}
    assert read("application/json; charset=utf-8", json.dumps({"q": "x"}).encode(), query) == {"q": "x"}
    assert read("application/merge-patch+json", b'{"q": "x"}') == {"q": "x"}
    assert read(None, json.dumps(FIELDS).encode()) == FIELDS  # no Content-Type: JSON, as before forms were read


def test_form_values_are_strings_read_as_libretranslate_reads_them():
    fields = read("application/x-www-form-urlencoded",
                  b"q=caf%C3%A9+au+lait&source=EN&target=de&alternatives=2&format=html&api_key=&secret=x")
    request = parse_fields(fields)
    assert (request.q, request.source, request.target, request.format, request.alternatives) == (
        "café au lait", "en", "de", "html", 2)
    assert parse_fields({**FIELDS, "format": None}).format == "text"


@pytest.mark.parametrize(
    ("content_type", "body", "query", "error", "message"),
    [
        ("application/x-www-form-urlencoded", b"q=caf%E9&source=en&target=de", b"", BadRequest,
         "field 'q' in the form is not valid UTF-8: byte 0xe9 at offset 3"),
        (None, b"", b"q=%FF", BadRequest, "field 'q' in the query string is not valid UTF-8: byte 0xff at offset 0"),
        ("application/x-www-form-urlencoded", b"q=a&q=b&source=en&target=de", b"", InvalidFields,
         "field 'q' is given 2 times (in the form): give it once"),
        ("application/x-www-form-urlencoded", b"q=a&source=en&target=de", b"target=fr", InvalidFields,
         "field 'target' is given 2 times (in the query string and in the form): give it once"),
        ("multipart/form-data", b"q=a", b"", BadRequest, "the body is not valid multipart/form-data "
         "(NoBoundaryInMultipartDefect"),
        ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Type: text/plain\r\n\r\nA dog.\r\n--xyz--\r\n", b"",
         BadRequest, "part 1 of the multipart/form-data body has no name"),
        ("text/plain", b"A dog.", b"", UnsupportedMediaType, "the body is text/plain, which this service does not "
         "read: send application/json, application/x-www-form-urlencoded or multipart/form-data"),
        (None, b"", b"", BadRequest, "the request is empty: send q, source and target as a JSON object, a form, or "
         "in the query string"),
        ("application/x-www-form-urlencoded", b"source=en&target=de", b"", InvalidFields, "field 'q' is missing"),
        ("application/x-www-form-urlencoded", b"q=a&source=en&target=de&alternatives=two", b"", InvalidFields,
         "field 'alternatives' is 'two', not a whole number"),
        ("application/x-www-form-urlencoded", b"q=a&source=en&target=de&format=pdf", b"", InvalidFields,
         "field 'format': Input should be 'text' or 'html'"),
    ],
)
def test_a_bad_form_or_query_string_is_refused_naming_the_field_or_the_problem(content_type, body, query, error,
                                                                              message):
    err = refused(content_type, body, query)
    assert type(err) is error and message in err.message
    assert err.status == {BadRequest: 400, InvalidFields: 422, UnsupportedMediaType: 415}[error]


# --------------------------------------------------------------------------------------------------- JSON


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"q": "A dog, "source": "en"}', "the body is not valid JSON: Expecting ',' delimiter at line 1 column 16"),
        (b'{"q": "A dog', "the body is not valid JSON: Unterminated string starting at line 1 column 7"),
        (b'\xef\xbb\xbf{"q": "A dog.", "source": "en", "target": "de"}',
         "the body starts with a UTF-8 byte-order mark (EF BB BF): send the JSON without it"),
        (b'{"q": ' + b"7" * 5000 + b', "source": "en", "target": "de"}',
         "the body is not usable JSON: it holds an integer of 5000 digits, more than the 4300 digits Python reads"),
        (b'{"q": "a", "source": "en", "target": "de", "alternatives": -' + b"9" * 4301 + b"}",
         "the body is not usable JSON: it holds an integer of 4301 digits"),
    ],
)
def test_a_json_body_that_cannot_be_read_is_a_400_that_speaks_to_the_client(body, message):
    err = refused("application/json", body)
    assert err.status == 400 and err.message.startswith(message)
    assert "at at" not in err.message and "utf-8-sig" not in err.message


@pytest.mark.parametrize("name", ["source", "target", "format", "api_key"])
def test_a_lone_surrogate_in_a_string_field_is_a_400_that_writes_its_escape(name):
    err = refused("application/json", json.dumps({**FIELDS, name: "x\udfff"}).encode())
    assert err.status == 400
    assert err.message == f"field {name!r} is not valid Unicode: an unpaired surrogate \\udfff at character 2"
    err.message.encode("utf-8")  # the response can be written


@pytest.mark.parametrize(
    ("alternatives", "message"),
    [(True, "is a boolean, not a whole number"), (1.5, "is a number, not a whole number"),
     (-1, "is -1: send 0 or more"), ("9" * 40, "not a whole number")],
)
def test_alternatives_must_be_a_whole_number(alternatives, message):
    with pytest.raises(InvalidFields) as caught:
        parse_fields({**FIELDS, "alternatives": alternatives})
    assert caught.value.message.startswith("field 'alternatives' ") and message in caught.value.message


# --------------------------------------------------------------------------------------------------- languages


class OneLetterEngine:
    """A tokenizer of one id per character; a beam of 4 (3 alternatives at most)."""

    max_line_tokens = 20
    beam = 4

    def __init__(self, directions: tuple[str, ...]):
        self.languages = ServedLanguages(Directions.of(directions))

    def source_ids(self, line, direction):
        return [ord(c) for c in line] + [0]


def test_languages_are_named_in_english_and_a_code_outside_the_table_by_itself():
    listing = ServedLanguages(Directions.of(["en-de", "en-fr", "deu-eng", "xx-en"])).listing()
    assert listing == [{"code": "en", "name": "English", "targets": ["de", "fr"]},
                       {"code": "deu", "name": "German", "targets": ["eng"]},
                       {"code": "xx", "name": "xx", "targets": ["en"]}]


def test_more_alternatives_than_the_beam_keeps_are_refused_naming_the_field_and_the_flag():
    settings = ServeSettings(model_dir="unused")
    engine = OneLetterEngine(("en-de",))
    assert prepare(TranslateRequest(**FIELDS, alternatives=3), engine, settings).alternatives == 3
    with pytest.raises(InvalidFields) as caught:
        prepare(TranslateRequest(**FIELDS, alternatives=4), engine, settings)
    assert caught.value.message == ("field 'alternatives' is 4, more than the 3 other hypotheses this service's "
                                    "beam of 4 keeps: ask for at most 3, or start the service with --beam 5")


def test_an_html_item_counts_its_text_nodes_against_the_line_limit_and_names_a_long_one_by_position():
    settings = ServeSettings(model_dir="unused", max_lines=2)
    engine = OneLetterEngine(("en-de",))
    with pytest.raises(OverLimit) as caught:
        prepare(TranslateRequest(**{**FIELDS, "q": "<p>a</p><p>b</p><p>c</p>"}, format="html"), engine, settings)
    assert caught.value.message.startswith("q has 3 text nodes to translate, more than the limit of 2")
    with pytest.raises(OverLimit) as caught:
        prepare(TranslateRequest(**{**FIELDS, "q": ["x", "<b>\n  " + "long " * 5 + "</b>"]}, format="html"),
                engine, settings)
    assert caught.value.message.startswith("q[1] text at line 2 column 3 is 25 source tokens long")


def test_alternatives_of_a_text_of_several_lines_take_each_lines_kth_hypothesis_distinct_from_the_best():
    from pipeline.runtime.serve.engine import Translation

    def line(best: str, *others: str) -> Translation:
        return Translation(best, [list(map(ord, o)) for o in others], lambda ids: "".join(map(chr, ids)))

    engine = OneLetterEngine(("en-de",))
    request = TranslateRequest(**{**FIELDS, "q": ["one\n\ntwo", "three"]}, alternatives=3)
    prepared = prepare(request, engine, ServeSettings(model_dir="unused"))
    answer = prepared.response([line("1", "1b", "1c"), "", line("2", "2"), line("3", "3")])
    assert answer == {"translatedText": ["1\n\n2", "3"], "alternatives": [["1b\n\n2", "1c\n\n2"], []]}
