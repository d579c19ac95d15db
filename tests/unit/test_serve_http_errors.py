"""pipeline/runtime/serve/http_protocol.py under a real uvicorn (the service's own configuration, around a small echo
application): what the HTTP layer answers itself is JSON {"error": ...} with a message for the client, and slow or
idle clients are let go on time: a half-sent head, a stalled body, a connection over the cap, a stalled body at
shutdown. The limits are short here (fractions of a second); the bounds asserted are generous multiples of them."""

from __future__ import annotations

import asyncio
import http.client
import json
import resource
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

import uvicorn  # noqa: E402

from pipeline.runtime.serve.http_protocol import answer_json_when_cancelled  # noqa: E402
from pipeline.runtime.serve.server import FILE_HEADROOM, allow_open_files, bind, uvicorn_config  # noqa: E402
from pipeline.runtime.serve.settings import ServeSettings, SettingsError  # noqa: E402
from pipeline.tools.cli import main  # noqa: E402

HEAD = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


async def echo(scope, receive, send) -> None:
    """Answers {"bytes": length of the body}; takes part in the lifespan as the service's application does."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size, more = size + len(message.get("body", b"")), message.get("more_body", False)
    body = json.dumps({"bytes": size}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@dataclass
class Served:
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


@contextmanager
def serving(**limits) -> Iterator[Served]:
    """The echo application under uvicorn as `mtpipe serve` configures it, in a thread, with these settings."""
    settings = ServeSettings(model_dir=Path("unused"), host="127.0.0.1", port=0, **limits)
    server = uvicorn.Server(uvicorn_config(echo, settings))
    listener = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield Served(server, thread, listener.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(10)


def read_response(connection: socket.socket) -> tuple[int, dict[str, str], dict]:
    reply = http.client.HTTPResponse(connection)
    reply.begin()
    return reply.status, {k.lower(): v for k, v in reply.getheaders()}, json.loads(reply.read())


def closed_by_peer(connection: socket.socket) -> bool:
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def exchange(served: Served, raw: bytes) -> tuple[int, dict[str, str], dict]:
    """The answer to `raw`, checking that the service closed the connection after it."""
    with served.connect() as connection:
        connection.sendall(raw)
        answer = read_response(connection)
        assert closed_by_peer(connection)
    return answer


@pytest.fixture(scope="module")
def service() -> Iterator[Served]:
    with serving(max_request_bytes=4096) as served:
        yield served


# --------------------------------------------------------------------------------------------------- bad requests


@pytest.mark.parametrize(("raw", "status", "message"), [
    (b"NOT A REQUEST\r\n\r\n", 400, "not a valid HTTP/1.1 request: illegal request line: 'NOT A REQUEST'"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", 400,
     "not a valid HTTP/1.1 request: illegal header line: 'Bad Header: y'"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400,
     "not a valid HTTP/1.1 request: illegal header line: 'X: a\\x00b'"),
    # Incomplete: h11 measures a head while it waits for the rest (one that arrives whole in a read passes).
    (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 17000, 431,
     "the request line and headers are more than 16384 bytes"),
    (HEAD + b"Content-Length: " + str(10**20).encode() + b"\r\n\r\n{", 413,
     "the body is 100000000000000000000 bytes, more than the limit of 4096 (--max-request-bytes 4096)"),
    (HEAD + b"Content-Length: -1\r\n\r\n", 400, "not a valid HTTP/1.1 request: bad Content-Length"),
    (HEAD + b"Transfer-Encoding: gzip\r\n\r\n", 501, "Only Transfer-Encoding: chunked is supported"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "not a valid HTTP/1.1 request"),
], ids=["request line", "header name", "header value", "head too large", "absurd content-length",
        "negative content-length", "transfer coding", "chunk size"])
def test_what_the_http_layer_refuses_is_a_json_error_naming_the_problem(service, raw, status, message):
    answer_status, headers, body = exchange(service, raw)
    assert (answer_status, headers["content-type"], headers["connection"]) == (status, "application/json", "close")
    assert message in body["error"]


def test_a_good_request_still_gets_its_answer_and_keeps_its_connection(service):
    with service.connect() as connection:
        for _ in range(2):
            connection.sendall(HEAD + b"Content-Length: 2\r\n\r\n{}")
            assert read_response(connection)[::2] == (200, {"bytes": 2})


# --------------------------------------------------------------------------------------------------- slow clients


def test_a_half_sent_head_gets_408_at_the_header_timeout_even_when_it_trickles():
    with serving(header_timeout_s=0.5) as served, served.connect() as connection:
        started = time.monotonic()
        for byte in HEAD[:8]:  # one byte every 50 ms: each arrival must not restart the timer
            connection.sendall(bytes([byte]))
            time.sleep(0.05)
        status, _, body = read_response(connection)
        waited = time.monotonic() - started
        assert status == 408 and body["error"] == ("the request line and headers were not complete within 0.5 s "
                                                   "(--header-timeout-s 0.5)")
        assert 0.5 <= waited < 3 and closed_by_peer(connection)


def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout_without_an_answer():
    with serving(header_timeout_s=0.3) as served, served.connect() as connection:
        started = time.monotonic()
        assert connection.recv(100) == b""
        assert 0.3 <= time.monotonic() - started < 3


def test_an_idle_keep_alive_connection_is_closed_at_the_header_timeout_after_its_response():
    with serving(header_timeout_s=0.3) as served, served.connect() as connection:
        connection.sendall(HEAD + b"Content-Length: 2\r\n\r\n{}")
        assert read_response(connection)[0] == 200
        started = time.monotonic()
        assert connection.recv(100) == b""  # well before uvicorn's own keep-alive timeout of 5 s
        assert time.monotonic() - started < 3


def test_a_stalled_body_gets_408_at_the_body_deadline_and_is_closed():
    with serving(body_timeout_s=0.5, header_timeout_s=30) as served, served.connect() as connection:
        connection.sendall(HEAD + b"Content-Length: 400\r\n\r\n" + b"x" * 20)
        started = time.monotonic()
        status, headers, body = read_response(connection)
        assert status == 408 and 0.5 <= time.monotonic() - started < 3
        assert body["error"] == "the request body was not complete within 0.5 s of its headers (--body-timeout-s 0.5)"
        assert closed_by_peer(connection)


def test_a_connection_over_the_cap_gets_503_and_one_under_it_is_served_again_once_another_closed():
    with serving(max_connections=2) as served:
        first, second = served.connect(), served.connect()
        time.sleep(0.2)  # both accepted: they count though they have sent nothing
        status, headers, body = exchange(served, HEAD + b"Content-Length: 2\r\n\r\n{}")
        assert (status, headers["retry-after"]) == (503, "1")
        assert body["error"] == "the service has its limit of 2 connections open (--max-connections 2): retry"
        first.close()
        time.sleep(0.2)
        assert exchange(served, HEAD + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")[::2] == (200, {"bytes": 2})
        second.close()


def test_shutdown_answers_a_stalled_body_at_once_and_finishes_in_well_under_its_grace():
    with serving(body_timeout_s=60, request_timeout_s=60) as served, served.connect() as connection:
        idle = served.connect()
        connection.sendall(HEAD + b"Content-Length: 400\r\n\r\n" + b"x" * 20)
        time.sleep(0.2)
        started = time.monotonic()
        served.server.should_exit = True  # what SIGTERM sets
        status, headers, body = read_response(connection)
        served.thread.join(10)
        assert time.monotonic() - started < 2 and not served.thread.is_alive()
        assert (status, headers["retry-after"]) == (503, "1")
        assert body["error"] == "the service is stopping and this request's body had not all come: send it again"
        assert closed_by_peer(idle)
        idle.close()


def test_an_upgrade_request_is_served_as_plain_http(service):
    upgrade = b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    with service.connect() as connection:
        connection.sendall(HEAD + upgrade + b"Content-Length: 2\r\n\r\n{}")
        assert read_response(connection)[::2] == (200, {"bytes": 2})


# --------------------------------------------------------------------------------------------------- the rest


@pytest.mark.parametrize(("field", "value", "message"), [
    ("header_timeout_s", 0.0, "--header-timeout-s must be positive, got 0.0"),
    ("body_timeout_s", -1.0, "--body-timeout-s must be positive, got -1.0"),
    ("max_connections", 0, "--max-connections must be at least 1, got 0"),
])
def test_a_limit_out_of_range_is_refused_naming_its_flag(field, value, message):
    with pytest.raises(SettingsError, match=message):
        ServeSettings(model_dir=Path("unused"), **{field: value})


def test_a_request_still_running_when_its_task_is_cancelled_gets_a_json_503():
    async def cancelled_midway() -> list[dict]:
        sent: list[dict] = []

        async def never_answers(scope, receive, send) -> None:
            await asyncio.sleep(3600)

        async def send(message) -> None:
            sent.append(message)

        task = asyncio.ensure_future(answer_json_when_cancelled(never_answers)({"type": "http"}, None, send))
        await asyncio.sleep(0.01)
        task.cancel()  # as uvicorn does once its graceful shutdown's time is up
        with pytest.raises(asyncio.CancelledError):
            await task
        return sent

    start, body = asyncio.run(cancelled_midway())
    assert start["status"] == 503 and (b"content-type", b"application/json") in start["headers"]
    assert json.loads(body["body"]) == {"error": "the service stopped before this request was answered"}


def test_more_connections_than_the_process_may_open_are_refused_naming_the_flag(capsys):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    assert main(["serve", "--model", "unused", "--max-connections", str(hard)]) == 1
    assert f"--max-connections {hard} needs {hard + FILE_HEADROOM} open files" in capsys.readouterr().err


def test_the_soft_limit_on_open_files_is_raised_to_what_the_cap_needs():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or (hard != resource.RLIM_INFINITY and soft >= hard):
        pytest.skip("the soft limit cannot be raised here")
    try:
        allow_open_files(soft + 1 - FILE_HEADROOM)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft + 1
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
