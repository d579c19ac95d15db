"""The JSON shapes of the API. `POST /translate` takes LibreTranslate's body and answers in its shape:

    {"q": "A dog runs.", "source": "en", "target": "de"}           -> {"translatedText": "..."}
    {"q": ["A dog runs.", "Two men."], "source": "en", "target": "de"} -> {"translatedText": ["...", "..."]}

`format` may only be "text" (the model translates plain text). Other fields LibreTranslate clients send
(`api_key`, `alternatives`) are accepted and ignored, so those clients work unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictStr, WithJsonSchema
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


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    q: Annotated[str | list[str], PlainValidator(text_or_texts), WithJsonSchema(QUERY_SCHEMA)]
    source: StrictStr = Field(description="source language code, or \"auto\" where one source language goes into "
                              "the target (GET /languages lists them)")
    target: StrictStr = Field(description="target language code (GET /languages lists them)")
    format: Literal["text"] = "text"


class TranslateResponse(BaseModel):
    translatedText: str | list[str] = Field(description="a string for a string `q`, a list for a list, in order")


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class ErrorResponse(BaseModel):
    error: str
