"""The errors the service answers with, each an HTTP status and a message naming the field, line or limit at fault.

The response body is LibreTranslate's error shape, `{"error": message}`, for every status.
"""

from __future__ import annotations

from pipeline.runtime.serve.settings import flag


class ApiError(Exception):
    status = 400

    def __init__(self, message: str, headers: dict[str, str] | None = None):
        # A lone surrogate from the request (JSON's "\\udfff") quoted in a message could not be encoded as UTF-8
        # in the response: it is written as its escape.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(ApiError):
    """The body is not UTF-8 JSON, or a language is not this model's (400)."""


class InvalidFields(ApiError):
    """The JSON has a missing field, a wrong type or an empty list (422)."""

    status = 422


class OverLimit(ApiError):
    """A request larger than a settable limit (413); the message names the limit's flag and value."""

    status = 413

    def __init__(self, what: str, limit_name: str, limit: int):
        super().__init__(f"{what}, more than the limit of {limit} ({flag(limit_name)} {limit})")
        self.limit_name, self.limit = limit_name, limit


class Overloaded(ApiError):
    """Not accepted now: the queue is full or the service is stopping (503); retrying later can succeed."""

    status = 503

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class DeadlineExceeded(ApiError):
    """Accepted, but not answered within the request deadline (504); its lines not yet decoded were dropped."""

    status = 504
