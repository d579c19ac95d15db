"""`mtpipe serve` as a real process on 127.0.0.1, called over real HTTP connections: the endpoints, every bad input,
concurrent clients (their translations equal `Translator`'s on the same lines), deadlines, a full queue, a client
that disconnects, and SIGTERM while a request is in flight.

The export of the sharpened tiny model (tests/e2e/conftest.py) serves the module. Two services run on it:
`service` with small request limits for the endpoint and input tests, and `slow_service` with one worker, one line
per batch, beam 8 and a deadline of 1 s, so that a request of 64 long lines (three test sentences each) takes
several times that, even on a fast machine: each line is a batch of its own, decoded one after another.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from pipeline.tools.cli import main
from tests.conftest import multi30k_lines
from tests.service_process import ServiceProcess

pytestmark = pytest.mark.e2e

LIMITS = ("--max-lines", "8", "--max-line-tokens", "64", "--max-request-bytes", "4096", "--max-wait-ms", "20")
SLOW = ("--workers", "1", "--max-batch-tokens", "1", "--max-wait-ms", "0", "--request-timeout-s", "1",
        "--max-lines", "64", "--max-queued-lines", "64", "--beam", "8")


@pytest.fixture(scope="module")
def service(export_dir):
    with ServiceProcess(export_dir, *LIMITS) as running:
        yield running


@pytest.fixture(scope="module")
def slow_service(export_dir):
    with ServiceProcess(export_dir, *SLOW) as running:
        yield running


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return multi30k_lines("test_2016_flickr", "en", 192)


@pytest.fixture(scope="module")
def long_lines(sentences) -> list[str]:
    """64 lines of three sentences each."""
    return [" ".join(sentences[i : i + 3]) for i in range(0, 192, 3)]


def metric(service: ServiceProcess, name: str, labels: str = "") -> float:
    """A sample of GET /metrics (0 when the series does not exist yet)."""
    text = service.get("/metrics")[1].decode()
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(match[1]) if match else 0.0


def wait_until_idle(service: ServiceProcess, timeout_s: float = 10.0) -> None:
    """Until no line is queued or being decoded (a previous test's dropped request may still have one in flight)."""
    deadline = time.monotonic() + timeout_s
    while metric(service, "mtpipe_serve_busy_workers") or metric(service, "mtpipe_serve_queued_lines"):
        assert time.monotonic() < deadline, "the service kept working"
        time.sleep(0.02)


def raw_post(service: ServiceProcess, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    url = urlsplit(service.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request("POST", "/translate", body=body, headers={"Content-Type": "application/json",
                                                                       **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def request(q, target: str = "de", source: str = "en") -> dict:
    return {"q": q, "source": source, "target": target}


# --------------------------------------------------------------------------------------------------- endpoints


def test_health_ready_languages_metrics_and_docs_answer(service, export_dir):
    assert service.get("/health") == (200, b'{"status":"alive"}')
    status, ready = service.get("/ready")
    assert status == 200
    assert json.loads(ready) == {"status": "ready", "model": str(export_dir), "precision": "fp32", "beam": 4,
                                 "workers": 2}
    assert json.loads(service.get("/languages")[1]) == [{"code": "en", "name": "English", "targets": ["de"]}]
    status, text = service.get("/metrics")
    assert status == 200 and b"# TYPE mtpipe_serve_request_seconds histogram" in text
    for name in (b"mtpipe_serve_batch_lines", b"mtpipe_serve_sentences_total", b"mtpipe_serve_source_tokens_total"):
        assert name in text
    schema = json.loads(service.get("/openapi.json")[1])
    assert {"/translate", "/languages", "/health", "/ready", "/metrics"} <= set(schema["paths"])
    assert schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "required"] == ["q", "source", "target"]
    assert service.get("/docs")[0] == 200


def test_a_string_is_translated_to_a_string_and_a_list_to_a_list_as_translator_does(service, translator, sentences):
    expected = translator.translate(sentences[:3], beam=4)
    assert service.post_json("/translate", request(sentences[0])) == (200, {"translatedText": expected[0]})
    status, body = service.post_json("/translate", {**request(sentences[:3], source="auto"), "api_key": ""})
    assert (status, body["translatedText"]) == (200, expected)
    assert [d["language"] for d in body["detectedLanguage"]] == ["en"] * 3


def test_line_breaks_and_blank_lines_are_kept(service, translator, sentences):
    expected = translator.translate(sentences[:2], beam=4)
    status, body = service.post_json("/translate", request([f"{sentences[0]}\n\n{sentences[1]}", "", "  "]))
    assert (status, body) == (200, {"translatedText": [f"{expected[0]}\n\n{expected[1]}", "", ""]})


# --------------------------------------------------------------------------------------------------- bad input


BAD_BODIES = [
    (b'{"q": "A dog", "source": "en",', 400, "the body is not valid JSON: Expecting property name"),
    (b'{"q": "caf\xe9", "source": "en", "target": "de"}', 400, "the body is not valid UTF-8: byte 0xe9 at offset 10"),
    (b"", 400, "the body is empty"),
    (b"[" * 3000 + b"]" * 1000, 400, "nested too deeply"),
    (b'{"q": "A\\ud800 dog", "source": "en", "target": "de"}', 400,
     "q line 1 is not valid Unicode: an unpaired surrogate \\ud800 at character 2"),
    (json.dumps({"source": "en", "target": "de"}).encode(), 422, "field 'q' is missing"),
    (json.dumps({"q": "A dog", "source": "en"}).encode(), 422, "field 'target' is missing"),
    (json.dumps(request(7)).encode(), 422, "field 'q' is a number, not a string or a list of strings"),
    (json.dumps(request(["A dog", 7])).encode(), 422, "field 'q' item 1 is a number, not a string"),
    (json.dumps({"q": "A dog", "source": "en", "target": ["de"]}).encode(), 422,
     "field 'target': Input should be a valid string"),
    (json.dumps(request([])).encode(), 422, "field 'q' is an empty list: send at least one string"),
    (json.dumps(["A dog"]).encode(), 422, "the body must be a JSON object with q, source and target, not a list"),
    (json.dumps({**request("A dog"), "format": "pdf"}).encode(), 422,
     "field 'format': Input should be 'text' or 'html'"),
    (json.dumps(request("A dog", target="fr")).encode(), 400, "target 'fr' is not one of this model's targets: de "
     "(directions: en-de)"),
    (json.dumps(request("A dog", source="cs")).encode(), 400, "this model does not translate cs-de; its directions: "
     "en-de"),
    (json.dumps(request(["A dog."] * 9)).encode(), 413, "q has 9 lines (line breaks inside strings count), more "
     "than the limit of 8 (--max-lines 8)"),
    (json.dumps(request(["A dog.", "dog " * 70])).encode(), 413, "more than the limit of 64 (--max-line-tokens 64)"),
    (json.dumps(request("A dog. " * 700)).encode(), 413, "more than the limit of 4096 (--max-request-bytes 4096)"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD_BODIES,
                         ids=[message.split(":")[0][:40] for _, _, message in BAD_BODIES])
def test_bad_input_gets_a_4xx_naming_the_problem(service, body, status, message):
    answer_status, answer = raw_post(service, body)
    assert answer_status == status and message in answer["error"]


def test_a_body_over_the_limit_is_refused_from_its_content_length_before_it_is_sent(service):
    url = urlsplit(service.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as connection:
        connection.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 100000000\r\n\r\n{")
        reply = http.client.HTTPResponse(connection)
        reply.begin()
        body = json.loads(reply.read())
    assert reply.status == 413 and body["error"].startswith("the body is 100000000 bytes, more than the limit")


def test_wrong_methods_and_paths_get_json_errors_and_no_bad_input_ever_got_a_5xx(service):
    assert service.get("/translate")[0] == 405 and json.loads(service.get("/translate")[1]) == {
        "error": "Method Not Allowed"}
    assert service.get("/nowhere")[0] == 404
    text = service.get("/metrics")[1].decode()
    statuses = re.findall(r'^mtpipe_serve_requests_total\{endpoint="[^"]*",status="(\d+)"\}', text, re.MULTILINE)
    assert statuses and not [s for s in statuses if s.startswith("5")]
    assert service.get("/ready")[0] == 200


# --------------------------------------------------------------------------------------------------- concurrency


def test_concurrent_clients_share_batches_and_each_gets_translator_s_translations(service, translator, sentences):
    lines = sentences[:64]
    expected = translator.translate(lines, beam=4)
    # 24 clients at once: single strings and lists of 3 or 4 lines, interleaved.
    requests, start = [], 0
    for client in range(24):
        size = 1 if client % 3 == 0 else 2 + client % 3
        requests.append((start, size, client % 3 == 0))
        start += size
    assert start <= len(lines)
    batches_before = metric(service, "mtpipe_serve_batch_lines_count")
    barrier = threading.Barrier(len(requests))

    def call(spec):
        first, size, single = spec
        q = lines[first] if single else lines[first : first + size]
        barrier.wait()
        return service.post_json("/translate", request(q))

    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(call, requests))
    for (first, size, single), (status, body) in zip(requests, answers, strict=True):
        assert status == 200
        assert body["translatedText"] == (expected[first] if single else expected[first : first + size])
    assert metric(service, "mtpipe_serve_batch_lines_count") - batches_before < len(requests)


# --------------------------------------------------------------------------------------------------- deadlines


def test_a_request_over_its_deadline_gets_504_and_its_remaining_lines_are_dropped(slow_service, long_lines):
    wait_until_idle(slow_service)
    dropped_before = metric(slow_service, "mtpipe_serve_dropped_lines_total", '{reason="deadline"}')
    started = time.monotonic()
    status, body = slow_service.post_json("/translate", request(long_lines))
    assert status == 504 and time.monotonic() - started < 5
    assert "not translated within the request deadline of 1 s (--request-timeout-s): " in body["error"]
    assert re.search(r"\d+ of 64 lines were done, the rest were dropped", body["error"])
    assert metric(slow_service, "mtpipe_serve_dropped_lines_total", '{reason="deadline"}') > dropped_before
    assert slow_service.get("/ready")[0] == 200


def test_a_request_that_would_overfill_the_queue_gets_503_with_retry_after(slow_service, sentences, long_lines):
    wait_until_idle(slow_service)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(slow_service.post_json, "/translate", request(long_lines))
        deadline = time.monotonic() + 5
        while metric(slow_service, "mtpipe_serve_queued_lines") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        url = urlsplit(slow_service.url)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        connection.request("POST", "/translate", body=json.dumps(request(sentences[:8])),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        body = json.loads(response.read())
        connection.close()
        assert first.result()[0] == 504  # the first one runs out of time
    assert response.status == 503 and response.getheader("Retry-After") == "1"
    assert "over the queue limit of 64 lines" in body["error"] and "--max-queued-lines" in body["error"]


def test_a_client_that_disconnects_leaves_no_work_behind(slow_service, long_lines):
    wait_until_idle(slow_service)
    dropped_before = metric(slow_service, "mtpipe_serve_dropped_lines_total", '{reason="disconnect"}')
    translated_before = metric(slow_service, "mtpipe_serve_sentences_total")
    url = urlsplit(slow_service.url)
    body = json.dumps(request(long_lines)).encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as connection:
        connection.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.2)  # decoding has started; the deadline (1 s) is far
    wait_until_idle(slow_service, timeout_s=5)
    dropped = metric(slow_service, "mtpipe_serve_dropped_lines_total", '{reason="disconnect"}') - dropped_before
    translated = metric(slow_service, "mtpipe_serve_sentences_total") - translated_before
    assert dropped > 0 and translated + dropped == 64
    assert metric(slow_service, "mtpipe_serve_requests_total", '{endpoint="/translate",status="499"}') == 1


# --------------------------------------------------------------------------------------------------- lifecycle


def test_sigterm_finishes_the_request_in_flight_then_refuses_connections_and_exits(export_dir, translator,
                                                                                  long_lines):
    lines = long_lines[:32]
    expected = translator.translate(lines, beam=4)
    with ServiceProcess(export_dir, "--workers", "1", "--max-batch-tokens", "1", "--max-lines", "64") as service:
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(service.post_json, "/translate", request(lines))
            deadline = time.monotonic() + 10
            while metric(service, "mtpipe_serve_busy_workers") == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            service.send_signal(signal.SIGTERM)
            url = urlsplit(service.url)
            refused = False
            deadline = time.monotonic() + 3
            while not refused and time.monotonic() < deadline and not in_flight.done():
                try:
                    socket.create_connection((url.hostname, url.port), timeout=1).close()
                    time.sleep(0.02)
                except OSError:
                    refused = True
            assert in_flight.result() == (200, {"translatedText": expected})
        assert refused, "a new connection was accepted after SIGTERM"
        assert service.process.wait(30) == -signal.SIGTERM  # uvicorn ends by the signal it shut down for
        assert "Finished server process" in service.log()


def test_int8_is_refused_naming_the_missing_graphs_when_the_export_has_none(export_dir, capsys):
    assert main(["serve", "--model", str(export_dir), "--int8"]) == 1
    assert f"{export_dir} has no int8 ONNX graphs (export.int8: true)" in capsys.readouterr().err
