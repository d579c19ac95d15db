"""`mtpipe serve` against slow and idle clients, as a real process over real sockets: 200 connections that stop
halfway through their request head and one that stalls in its body leave other clients their latency and are let
go at their timeouts with a JSON 408; SIGTERM with such clients connected answers every complete request and exits
at once instead of waiting out its grace period (35 s at the default request deadline); and what the HTTP layer
refuses is JSON. tests/unit/test_serve_http_errors.py checks each limit on its own, with short timeouts.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from urllib.parse import urlsplit

import pytest

from tests.service_process import ServiceProcess

pytestmark = pytest.mark.e2e

HALF_OPEN = 200
HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 5, 6
SENTENCE = "A man in a blue shirt is standing on a ladder."
POST_HEAD = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def connect(service: ServiceProcess) -> socket.socket:
    url = urlsplit(service.url)
    return socket.create_connection((url.hostname, url.port), timeout=30)


def half_sent_head(service: ServiceProcess) -> socket.socket:
    connection = connect(service)
    connection.sendall(POST_HEAD[:30])
    return connection


def stalled_body(service: ServiceProcess) -> socket.socket:
    """20 of the 400 bytes its head announces."""
    connection = connect(service)
    connection.sendall(POST_HEAD + b"Content-Length: 400\r\n\r\n" + b'{"q": "A dog", "sou')
    return connection


def read_json_response(connection: socket.socket) -> tuple[int, dict, float]:
    """(status, body, when it came) of the response on `connection`."""
    reply = http.client.HTTPResponse(connection)
    reply.begin()
    body = json.loads(reply.read())
    return reply.status, body, time.monotonic()


def median_latency_s(service: ServiceProcess, requests: int = 20) -> float:
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        assert service.post_json("/translate", {"q": SENTENCE, "source": "en", "target": "de"})[0] == 200
        latencies.append(time.perf_counter() - started)
    return statistics.median(latencies)


def test_half_sent_heads_and_a_stalled_body_leave_others_their_latency_and_get_408_at_their_timeouts(export_dir):
    limits = ("--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S), "--beam", "1")
    with ServiceProcess(export_dir, *limits) as service, ExitStack() as held:
        median_latency_s(service, 5)  # warm up
        unloaded = median_latency_s(service)
        opened = time.monotonic()
        half_open = [held.enter_context(half_sent_head(service)) for _ in range(HALF_OPEN)]
        body_opened = time.monotonic()
        stalled = held.enter_context(stalled_body(service))
        loaded = median_latency_s(service)
        measured = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(read_json_response, half_open))
            stalled_status, stalled_answer, stalled_at = pool.submit(read_json_response, stalled).result()
    # Measured while every slow client was still held; the bound is generous: a busy machine varies.
    assert measured - opened < HEADER_TIMEOUT_S
    assert loaded < 3 * unloaded + 0.05, f"median latency {loaded:.3f} s with slow clients, {unloaded:.3f} s without"
    assert {status for status, _, _ in answers} == {408}
    assert answers[0][1]["error"] == (f"the request line and headers were not complete within {HEADER_TIMEOUT_S} s "
                                      f"(--header-timeout-s {HEADER_TIMEOUT_S})")
    # Let go at the timeout, not long after: measured from the last one opened, with a generous margin.
    assert all(HEADER_TIMEOUT_S - 0.5 <= at - opened < HEADER_TIMEOUT_S + 3 for _, _, at in answers)
    assert stalled_status == 408 and BODY_TIMEOUT_S - 0.5 <= stalled_at - body_opened < BODY_TIMEOUT_S + 3
    assert stalled_answer["error"] == (f"the request body was not complete within {BODY_TIMEOUT_S} s of its headers "
                                       f"(--body-timeout-s {BODY_TIMEOUT_S})")


def test_sigterm_with_slow_clients_connected_answers_every_complete_request_and_exits_within_2_s(export_dir):
    lines = [SENTENCE] * 8
    # One worker, one line per batch: the complete request is still being decoded when SIGTERM comes.
    with ServiceProcess(export_dir, "--workers", "1", "--max-batch-tokens", "1") as service, ExitStack() as held:
        half_open = held.enter_context(half_sent_head(service))
        stalled = held.enter_context(stalled_body(service))
        complete = held.enter_context(connect(service))
        body = json.dumps({"q": lines, "source": "en", "target": "de"}).encode()
        complete.sendall(POST_HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.05)
        stopped = time.monotonic()
        service.send_signal(signal.SIGTERM)
        with ThreadPoolExecutor(2) as pool:
            in_flight = pool.submit(read_json_response, complete)
            stalled_status, stalled_answer, _ = read_json_response(stalled)
            assert service.process.wait(30) == -signal.SIGTERM
            exited = time.monotonic()
            status, answer, _ = in_flight.result()
        assert half_open.recv(100) == b""  # closed unanswered: it had not made a request
    assert exited - stopped < 2, f"exited {exited - stopped:.1f} s after SIGTERM"
    assert status == 200 and len(answer["translatedText"]) == len(lines)
    assert stalled_status == 503
    assert stalled_answer["error"] == "the service is stopping and this request's body had not all come: send it again"


@pytest.fixture(scope="module")
def service(export_dir):
    with ServiceProcess(export_dir, "--max-request-bytes", "4096") as running:
        yield running


@pytest.mark.parametrize(("raw", "status", "message"), [
    (b"GET /health HTTP/1.1 extra\r\n\r\n", 400,
     "not a valid HTTP/1.1 request: illegal request line: 'GET /health HTTP/1.1 extra'"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX Y: z\r\n\r\n", 400,
     "not a valid HTTP/1.1 request: illegal header line: 'X Y: z'"),
    (POST_HEAD + b"Content-Length: " + b"9" * 30 + b"\r\n\r\n{", 413,
     f"the body is {'9' * 30} bytes, more than the limit of 4096 (--max-request-bytes 4096)"),
], ids=["request line", "header", "content-length past h11's digits"])
def test_what_the_http_layer_of_the_service_refuses_is_a_json_error(service, raw, status, message):
    with connect(service) as connection:
        connection.sendall(raw)
        answer_status, answer, _ = read_json_response(connection)
    assert answer_status == status and answer == {"error": message}
