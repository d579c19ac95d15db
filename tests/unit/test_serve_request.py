"""pipeline/runtime/serve/translate_request.py: each bad body is refused with its own status and a message naming the
problem; a good one becomes source ids per line, tokenized for its direction, and comes back in the shape of `q`. The
engine is a stand-in whose tokenizer gives one id per character, and a tag id (the target's first letter, negated)
first where the model's targets are tagged (the limits are what is tested, not SentencePiece)."""

from __future__ import annotations

import json

import pytest

from pipeline.runtime.languages import Direction, Directions
from pipeline.runtime.serve.errors import BadRequest, InvalidFields, OverLimit
from pipeline.runtime.serve.languages import ServedLanguages
from pipeline.runtime.serve.settings import ServeSettings
from pipeline.runtime.serve.translate_request import parse_body, prepare


class CharacterEngine:
    max_line_tokens = 10

    def __init__(self, directions: tuple[str, ...] = ("en-de",)):
        self.languages = ServedLanguages(Directions.of(directions))

    def source_ids(self, line: str, direction: Direction) -> list[int]:
        tag = [-ord(direction.tgt[0])] if self.languages.directions.target_tags else []
        return tag + [ord(c) for c in line] + [0]


SETTINGS = ServeSettings(model_dir="unused", max_lines=5)


def body(**fields) -> bytes:
    return json.dumps({"q": "A dog.", "source": "en", "target": "de", **fields}).encode()


def prepared(**fields):
    return prepare(parse_body(body(**fields)), CharacterEngine(), SETTINGS)


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        (b"", BadRequest, "the body is empty"),
        (b'{"q": "caf\xe9", "source": "en", "target": "de"}', BadRequest,
         "not valid UTF-8: byte 0xe9 at offset 10"),
        (b'{"q": "a", "source": "en",', BadRequest, "not valid JSON: Expecting property name enclosed in double "
         "quotes at line 1 column 27"),
        (b"[" * 100_000 + b"]" * 100_000, BadRequest, "nested too deeply"),
        (b'["a dog"]', InvalidFields, "the body must be a JSON object with q, source and target, not a list"),
        (b'{"source": "en"}', InvalidFields, "field 'q' is missing; field 'target' is missing"),
        (body(q=3), InvalidFields, "field 'q' is a number, not a string or a list of strings"),
        (body(q=None), InvalidFields, "field 'q' is null, not a string or a list of strings"),
        (body(q=[]), InvalidFields, "field 'q' is an empty list: send at least one string"),
        (body(q=["a", {"b": 1}]), InvalidFields, "field 'q' item 1 is an object, not a string"),
        (body(source=1), InvalidFields, "field 'source': Input should be a valid string"),
        (body(format="pdf"), InvalidFields, "field 'format': Input should be 'text' or 'html'"),
    ],
)
def test_a_bad_body_is_refused_with_a_message_naming_the_problem(raw, error, message):
    with pytest.raises(error) as caught:
        parse_body(raw)
    assert message in caught.value.message
    assert caught.value.status == {BadRequest: 400, InvalidFields: 422}[error]


def test_fields_libretranslate_clients_add_are_ignored():
    request = parse_body(body(api_key="", alternatives=3))
    assert (request.q, request.source, request.target, request.format) == ("A dog.", "en", "de", "text")


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"target": "fr"}, BadRequest, "target 'fr' is not one of this model's targets: de (directions: en-de)"),
        ({"source": "fr"}, BadRequest, "this model does not translate fr-de; its directions: en-de"),
        ({"q": ["a", "b", "c\nd\ne\nf"]}, OverLimit, "q has 6 lines (line breaks inside strings count), more than the "
         "limit of 5 (--max-lines 5)"),
        ({"q": ["short", "this line is long"]}, OverLimit, "q[1] line 1 is 18 source tokens long, more than the "
         "limit of 10 (--max-line-tokens 10)"),
        ({"q": "ok\n\ud800"}, BadRequest, "q line 2 is not valid Unicode: an unpaired surrogate \\ud800 at "
         "character 1"),
    ],
)
def test_a_request_this_model_cannot_take_is_refused_naming_the_language_line_or_limit(fields, error, message):
    with pytest.raises(error) as caught:
        prepared(**fields)
    assert caught.value.message == message


def test_a_string_gives_a_string_and_a_list_a_list_with_line_breaks_and_blank_lines_kept():
    single = prepared(q="Hi.\r\nYo.")
    assert single.sources == [[72, 105, 46, 0], [89, 111, 46, 0]]
    assert single.assemble(["Hallo.", "Jo."]) == "Hallo.\nJo."

    several = prepared(q=["a", "", "b\n  \nc"], source="auto")
    assert several.sources == [[97, 0], None, [98, 0], None, [99, 0]]
    assert several.assemble(["A", "", "B", "", "C"]) == ["A", "", "B\n\nC"]


def test_lines_are_tokenized_for_the_requests_direction_on_a_model_of_several_targets():
    engine = CharacterEngine(("en-de", "en-fr"))
    for target in ("de", "fr"):
        request = prepare(parse_body(body(q="Hi\n", target=target, source="auto")), engine, SETTINGS)
        assert request.target == target
        assert request.sources == [[-ord(target[0]), 72, 105, 0], None]
    with pytest.raises(BadRequest) as caught:
        prepare(parse_body(body(target="cs")), engine, SETTINGS)
    assert caught.value.message == "target 'cs' is not one of this model's targets: de, fr (directions: en-de, en-fr)"

