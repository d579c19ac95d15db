"""uvicorn's h11 protocol with the read limits a public service needs, and JSON for every error it answers itself.

uvicorn bounds none of a client's reads: a connection that never sends is held forever, one that stops halfway
through its request head or body is held until it leaves (and holds up a graceful shutdown), and what it answers
itself is plain text. `LimitedH11Protocol` adds, per connection: a header timeout (the request head complete within
--header-timeout-s of the connection's start or its previous response, else 408, or a silent close when nothing
came), a body deadline (the body complete within --body-timeout-s of its head, else 408), a connection cap (beyond
--max-connections, 503 to the first request), the client's protocol errors as JSON with h11's status (400; 431 for a
head over 16 KiB, which h11 measures while the head is incomplete; 501 for a transfer coding but chunked; 413 for a
Content-Length longer than h11 reads), and a shutdown that answers 503 at once to a request whose body has not all
come. Each of those answers closes its connection; none reaches the application's metrics (a request cut off while
the application reads its body counts there as 499). `answer_json_when_cancelled` does the same for uvicorn's
plain-text 500 to a request still running when the graceful shutdown's time is up. Written against uvicorn 0.54.0
(pinned by the `serve` extra) and h11 0.16.0 (what it resolves to): it overrides H11Protocol's connection_made,
data_received, send_400_response, on_response_complete, shutdown and connection_lost, and reads the
RequestResponseCycle's flags.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import sys
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from pipeline.runtime.serve.settings import ServeSettings, flag

log = logging.getLogger("mtpipe.serve")

# h11 refuses a Content-Length of more than 20 digits as malformed (h11._headers.CONTENT_LENGTH_MAX_DIGITS); one of
# digits only is a body larger than any limit, which is 413, not 400.
TOO_LONG_CONTENT_LENGTH = re.compile(rb"^content-length:[ \t]*(\d{21,})[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)
# The longest request head h11 buffers while it waits for the rest (its default, given to uvicorn explicitly):
# past it, 431.
MAX_HEAD_BYTES = 16 * 1024
# The part of a request head kept to tell a too long Content-Length from a malformed one: more than h11 buffers.
HEAD_KEPT_BYTES = 2 * MAX_HEAD_BYTES
# h11 ends a message with the repr of the bytes it could not parse ("illegal header line: bytearray(b'X Y: z')").
H11_QUOTED_BYTES = re.compile(r"(?:bytearray\()?b(['\"])(.*)\1\)?$")
QUOTED_CHARS = 80


def describe(error: h11.RemoteProtocolError) -> str:
    """h11's message for the client: the bytes it quotes as text, shortened."""
    text = str(error)
    quoted = H11_QUOTED_BYTES.search(text)
    if quoted is None:
        return text
    shown = quoted[2] if len(quoted[2]) <= QUOTED_CHARS else quoted[2][:QUOTED_CHARS] + "..."
    return f"{text[: quoted.start()]}'{shown}'"


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode("ascii")  # ensure_ascii: any text the message quotes is escaped


def error_response(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole HTTP/1.1 response with the body {"error": message}, closing its connection."""
    body = error_body(message)
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "content-type: application/json",
             f"content-length: {len(body)}", "connection: close", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


async def send_error(send: Send, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """The same response through an ASGI `send`."""
    body = error_body(message)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


class LimitedH11Protocol(H11Protocol):
    """One HTTP/1.1 connection, as uvicorn's h11 protocol serves it, with the limits of `settings`."""

    def __init__(self, *args: Any, settings: ServeSettings, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = settings
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        # The request head read so far (bounded), for the message of a head h11 refuses.
        self._head = bytearray()

    @classmethod
    def factory(cls, settings: ServeSettings) -> Callable[..., LimitedH11Protocol]:
        """What uvicorn.Config takes as `http=`: it calls it with (config, server_state, app_state, _loop)."""
        return functools.partial(cls, settings=settings)

    # ------------------------------------------------------------------------------------------ uvicorn's hooks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # adds this connection to the server's set
        if len(self.connections) > self.settings.max_connections:
            # Answered once its request head is in, not now: a reply the client has not asked for yet can be lost
            # to the reset that its request, arriving at a closed socket, provokes.
            self.app = self._over_capacity
        self._watch_reads()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and len(self._head) < HEAD_KEPT_BYTES:
            self._head += data[: HEAD_KEPT_BYTES - len(self._head)]
        super().data_received(data)
        self._watch_reads()

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this from its `except h11.RemoteProtocolError:` (handle_events), so the error being
        # handled is h11's, with the status it suggests.
        error = sys.exc_info()[1]
        self._refuse(*self._protocol_error(error if isinstance(error, h11.RemoteProtocolError) else None))

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next request cycle when both sides are done
        self._watch_reads()

    def shutdown(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and self.conn.their_state is h11.SEND_BODY:
            # uvicorn would wait for this body until its graceful shutdown times out: a stalled client holds it up.
            self._refuse(503, "the service is stopping and this request's body had not all come: send it again",
                         (("retry-after", "1"),))
            return
        super().shutdown()  # closes idle connections and half-sent heads; the rest close once answered

    def connection_lost(self, exc: Exception | None) -> None:
        _cancel(self._head_timer)
        _cancel(self._body_timer)
        self._head_timer = self._body_timer = None
        super().connection_lost(exc)

    # ------------------------------------------------------------------------------------------ the limits

    def _watch_reads(self) -> None:
        """Keep the one timer that bounds what the connection waits for now running: a request head, or a body."""
        state = self.conn.their_state
        if state is not h11.IDLE or self.transport.is_closing():
            _cancel(self._head_timer)
            self._head_timer = None
            self._head.clear()
        elif self._head_timer is None:  # started once per request: data arriving does not restart it
            self._head_timer = self.loop.call_later(self.settings.header_timeout_s, self._head_overdue)
        if state is not h11.SEND_BODY or self.transport.is_closing():
            _cancel(self._body_timer)
            self._body_timer = None
        elif self._body_timer is None:
            self._body_timer = self.loop.call_later(self.settings.body_timeout_s, self._body_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if not self.conn.trailing_data[0]:  # nothing of a next request came: an idle connection, closed unanswered
            self.transport.close()
            return
        timeout = self.settings.header_timeout_s
        self._refuse(408, f"the request line and headers were not complete within {timeout:g} s "
                          f"({flag('header_timeout_s')} {timeout:g})")

    def _body_overdue(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if cycle.response_started:
            # Answered without the whole body (a 413 from its Content-Length): the rest is not waited for either.
            if cycle.response_complete:
                self.transport.close()
            else:
                cycle.keep_alive = False
            return
        timeout = self.settings.body_timeout_s
        self._refuse(408, f"the request body was not complete within {timeout:g} s of its headers "
                          f"({flag('body_timeout_s')} {timeout:g})")

    def _protocol_error(self, error: h11.RemoteProtocolError | None) -> tuple[int, str]:
        too_long = TOO_LONG_CONTENT_LENGTH.search(self._head)
        if error is not None and "Content-Length" in str(error) and too_long:
            digits, limit = too_long[1].decode("ascii"), self.settings.max_request_bytes
            size = digits if len(digits) <= 40 else f"a {len(digits)}-digit number of"
            return 413, (f"the body is {size} bytes, more than the limit of {limit} ({flag('max_request_bytes')} "
                         f"{limit})")
        status = error.error_status_hint if error is not None else 400
        if status == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
            limit = self.config.h11_max_incomplete_event_size or MAX_HEAD_BYTES
            return status, f"the request line and headers are more than {limit} bytes"
        return status, f"not a valid HTTP/1.1 request: {describe(error) if error is not None else 'unreadable'}"

    def _refuse(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Answer with a JSON error and close; a request the application is still reading sees its client gone."""
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.warning("%s: %d %s", client, status, message)
        cycle = self.cycle
        in_progress = cycle is not None and not cycle.response_complete
        if not (in_progress and cycle.response_started):  # never into the middle of a response
            self.transport.write(error_response(status, message, headers))
        self.transport.close()
        if in_progress:
            cycle.disconnected = True
            cycle.message_event.set()

    async def _over_capacity(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The application of a connection over the cap: 503 to its first request (then uvicorn closes it)."""
        limit = self.settings.max_connections
        message = f"the service has its limit of {limit} connections open ({flag('max_connections')} {limit}): retry"
        log.warning("%s", message)
        await send_error(send, 503, message, ((b"retry-after", b"1"),))


def answer_json_when_cancelled(app: ASGIApp) -> ASGIApp:
    """`app`, answering {"error": ...} with 503 to a request it had not answered when its task was cancelled (uvicorn
    cancels what still runs when the graceful shutdown's time is up, and answers it a plain-text 500)."""

    async def answering(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = False

        async def send_and_note_start(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, receive, send_and_note_start)
        except asyncio.CancelledError:
            if not started:
                await send_error(send, 503, "the service stopped before this request was answered")
            raise

    return answering
