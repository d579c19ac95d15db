"""The shapes of the API, LibreTranslate's: the fields of `POST /translate` and `POST /detect` (a JSON object, or the
same names in a form or the query string: pipeline/runtime/serve/request_fields.py) and the JSON of every answer.

    {"q": "A dog runs.", "source": "en", "target": "de"}           -> {"translatedText": "..."}
    {"q": ["A dog runs.", "Two men."], "source": "en", "target": "de"} -> {"translatedText": ["...", "..."]}
    {"q": "A dog runs.", "source": "auto", "target": "de", "alternatives": 2}
        -> {"translatedText": "...", "detectedLanguage": {"confidence": 92.2, "language": "en"},
            "alternatives": ["...", "..."]}
    POST /detect {"q": "A dog runs."} -> [{"confidence": 92.2, "language": "en"}]

`format` is "text" (the default; null too, as LibreTranslate reads it) or "html"; `source` and `target` are read
lower-cased (LibreTranslate does); `alternatives` is a whole number (a form sends it as digits); `api_key`, and
any field not named here, is accepted and ignored, so LibreTranslate's clients work unchanged.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictStr,
    WithJsonSchema,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

QUERY_SCHEMA = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
    "description": "Text to translate: a string, or a non-empty list of strings (translated one by one). "
    "Line breaks are kept: each line is translated on its own.",
}


def json_type(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def text_or_texts(value: Any) -> str | list[str]:
    """`q`: a string or a non-empty list of strings, with one error message saying which (pydantic's own union
    error lists a failure per alternative)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if not value:
            raise PydanticCustomError("empty_list", "is an empty list: send at least one string")
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise PydanticCustomError("list_item_type", "item {index} is {kind}, not a string",
                                          {"index": index, "kind": json_type(item)})
        return value
    raise PydanticCustomError("text_type", "is {kind}, not a string or a list of strings", {"kind": json_type(value)})


_DIGITS = re.compile(r"\s*[0-9]{1,18}\s*")


def whole_number(value: Any) -> int:
    """`alternatives`: a JSON integer (or an integral float), or a string of digits as a form sends it."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value[:40]) + ("..." if len(value) > 40 else "") if isinstance(value, str) else json_type(value)
        raise PydanticCustomError("whole_number", "is {shown}, not a whole number", {"shown": shown})
    if value < 0:
        raise PydanticCustomError("whole_number", "is {value}: send 0 or more", {"value": value})
    return value


def text_when_null(value: Any) -> Any:
    # LibreTranslate reads a missing or null format as "text".
    return "text" if value is None else value


LanguageCode = Annotated[StrictStr, AfterValidator(str.lower)]
# Any value is taken (LibreTranslate's clients send a string, or nothing); the service has no keys.
IgnoredKey = Annotated[Any, WithJsonSchema({"type": "string", "description": "accepted and ignored"})]


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    q: Annotated[str | list[str], PlainValidator(text_or_texts), WithJsonSchema(QUERY_SCHEMA)]
    source: LanguageCode = Field(description="source language code (GET /languages lists them), or \"auto\": the "
                                 "text's language is detected among the sources that go into the target")
    target: LanguageCode = Field(description="target language code (GET /languages lists them)")
    format: Annotated[Literal["text", "html"], BeforeValidator(text_when_null)] = Field(
        "text", description="text: plain text, each line translated on its own; html: an HTML document or "
              "fragment whose text nodes are translated, its tags and attributes kept")
    alternatives: Annotated[int, PlainValidator(whole_number), WithJsonSchema({"type": "integer", "minimum": 0})] = (
        Field(0, description="how many other translations of each text to give besides the best: at most the "
              "service's beam minus one (GET /ready shows the beam); html gives none"))
    api_key: IgnoredKey = None


class DetectRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    q: Annotated[str | list[str], PlainValidator(text_or_texts), WithJsonSchema(
        {**QUERY_SCHEMA, "description": "Text whose language to detect: a string, or a non-empty list of strings "
         "detected as one text."})]
    api_key: IgnoredKey = None


class DetectedLanguage(BaseModel):
    confidence: float = Field(ge=0, le=100, description="how likely the text is in this language, in percent")
    language: str = Field(description="a source language code of the model")


class TranslateResponse(BaseModel):
    translatedText: str | list[str] = Field(description="a string for a string `q`, a list for a list, in order")
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | SkipJsonSchema[None] = Field(
        None, description="only for source \"auto\": the language each text was translated from (a list for a "
        "list `q`)")
    alternatives: list[str] | list[list[str]] | SkipJsonSchema[None] = Field(
        None, description="only when alternatives > 0: the other distinct translations, best first (up to "
        "`alternatives` of them; a list per item for a list `q`)")


class Language(BaseModel):
    code: str
    name: str = Field(description="the language's English name (its code where the service knows none)")
    targets: list[str]


def form_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The schema of `model`'s fields sent as a form (urlencoded or multipart): one string per field, so a
    form's `q` is one text, and `alternatives` its digits."""
    schema = model.model_json_schema()
    properties = {name: {**field, **({"type": "string"} if name == "q" else {})}
                  for name, field in schema["properties"].items()}
    properties["q"].pop("anyOf")
    return {"type": "object", "properties": properties, "required": schema.get("required", [])}


class ErrorResponse(BaseModel):
    error: str


def openapi_request(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI of an operation whose handler reads its own fields (pipeline/runtime/serve/request_fields.py): the
    body as JSON, as an urlencoded form and as a multipart form, and the same fields in the query string, read when the
    body is not JSON (a request may have no body then)."""
    form = {"schema": form_schema(model)}
    query = [{"name": name, "in": "query", "required": False, "schema": schema,
              "description": "read when the body is not JSON (a form's fields and these are read together)"}
             for name, schema in form_schema(model)["properties"].items()]
    return {"parameters": query, "requestBody": {"required": False, "content": {
        "application/json": {"schema": model.model_json_schema()},
        "application/x-www-form-urlencoded": form,
        "multipart/form-data": form,
    }}}
