"""`mtpipe serve` met by LibreTranslate's own clients, unchanged: libretranslatepy 2.1.4 (an urlencoded form) and
deep-translator 1.11.4's LibreTranslator (the fields in the query string, an empty body), then the requests of
LibreTranslate's API documentation (JSON, curl's -d form and -F multipart, source "auto", format "html",
alternatives) and the two inputs that once got a 500.

The export of the sharpened tiny model (tests/e2e/conftest.py) serves the module: its outputs are garbage, so the
assertions are on shapes, on equality with `Translator`'s output, and on tags being kept.
"""

from __future__ import annotations

import html
import http.client
import json
import re
from urllib.parse import urlencode, urlsplit

import pytest
import requests

from pipeline.runtime.decoding import one_line
from tests.conftest import multi30k_lines
from tests.service_process import ServiceProcess

pytestmark = pytest.mark.e2e

BEAM = 4


@pytest.fixture(scope="module")
def service(export_dir):
    with ServiceProcess(export_dir, "--beam", str(BEAM), "--max-wait-ms", "5") as running:
        yield running


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return multi30k_lines("test_2016_flickr", "en", 4)


def send(service: ServiceProcess, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
         query: str = "") -> tuple[int, object]:
    """A POST as curl sends it: exactly these bytes and headers."""
    url = urlsplit(service.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        connection.request("POST", path + (f"?{query}" if query else ""), body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def alternatives(translator, text: str, count: int) -> list[str]:
    """What `alternatives: count` gives for a one-line text: the beam's other hypotheses, distinct, best excluded."""
    direction = translator.direction()
    nbest = translator.hypotheses_ids([translator.source_ids(text, direction)], beam=BEAM)[0]
    texts = [one_line(translator.tokenizer.decode(ids)) for ids in nbest]
    return list(dict.fromkeys(t for t in texts[1:] if t != texts[0]))[:count]


# --------------------------------------------------------------------------------------------------- clients


def test_libretranslatepy_translates_detects_and_lists_languages(service, translator, sentences):
    from libretranslatepy import LibreTranslateAPI

    for client in (LibreTranslateAPI(service.url), LibreTranslateAPI(service.url, api_key="any-key")):
        assert client.translate(sentences[0], "en", "de") == translator.translate(sentences[:1], beam=BEAM)[0]
        detected = client.detect(sentences[1])
        assert detected[0]["language"] == "en" and 50 < detected[0]["confidence"] <= 100
        assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]}]


def test_deep_translators_libretranslator_translates_a_text_and_a_batch(service, translator, sentences):
    from deep_translator import LibreTranslator

    expected = translator.translate(sentences, beam=BEAM)
    for source in ("en", "auto"):
        client = LibreTranslator(source=source, target="de", api_key="any-key", custom_url=service.url + "/")
        assert client.translate(sentences[0]) == expected[0]
        assert client.translate_batch(sentences) == expected


# --------------------------------------------------------------------------------------------------- API docs


def test_the_api_documentations_json_requests_get_libretranslates_answers(service, translator):
    hello = translator.translate(["Hello!"], beam=BEAM)[0]
    json_headers = {"Content-Type": "application/json"}

    def post(fields: dict) -> tuple[int, object]:
        return send(service, "/translate", json.dumps({**fields, "api_key": "xxxxxx"}).encode(), json_headers)

    assert post({"q": "Hello!", "source": "en", "target": "de"}) == (200, {"translatedText": hello})
    status, auto = post({"q": "Hello!", "source": "auto", "target": "de"})
    assert status == 200 and auto["translatedText"] == hello
    assert auto["detectedLanguage"]["language"] == "en" and 0 <= auto["detectedLanguage"]["confidence"] <= 100
    status, markup = post({"q": '<p class="green">Hello!</p>', "source": "en", "target": "de", "format": "html"})
    assert (status, markup) == (200, {"translatedText": f'<p class="green">{html.escape(hello, quote=False)}</p>'})
    status, options = post({"q": "Hello!", "source": "en", "target": "de", "alternatives": 3})
    assert (status, options) == (200, {"translatedText": hello, "alternatives": alternatives(translator, "Hello!", 3)})
    assert options["alternatives"] and hello not in options["alternatives"]


def test_curls_form_multipart_and_query_string_requests_translate_like_json(service, translator, sentences):
    expected = {"translatedText": translator.translate(sentences[:1], beam=BEAM)[0]}
    fields = {"q": sentences[0], "source": "en", "target": "de"}
    # curl -d 'q=...&source=en&target=de' .../translate
    form = send(service, "/translate", urlencode(fields).encode(),
                {"Content-Type": "application/x-www-form-urlencoded"})
    # curl -F q=... -F source=en -F target=de .../translate
    prepared = requests.Request("POST", service.url, files={k: (None, v) for k, v in fields.items()}).prepare()
    multipart = send(service, "/translate", prepared.body, {"Content-Type": prepared.headers["Content-Type"]})
    query = send(service, "/translate", query=urlencode(fields))
    assert form == multipart == query == (200, expected)
    status, detected = send(service, "/detect", urlencode({"q": sentences[0]}).encode(),
                            {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and detected[0]["language"] == "en"


def test_a_list_with_auto_gives_a_list_of_detected_languages_and_of_alternatives(service, translator, sentences):
    status, answer = send(service, "/translate", json.dumps({"q": sentences[:2], "source": "auto", "target": "de",
                                                             "alternatives": 2}).encode(),
                          {"Content-Type": "application/json"})
    assert status == 200 and answer["translatedText"] == translator.translate(sentences[:2], beam=BEAM)
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en", "en"]
    assert answer["alternatives"] == [alternatives(translator, s, 2) for s in sentences[:2]]


# --------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"q": ' + b"1" * 5000 + b', "source": "en", "target": "de"}', 400,
         "the body is not usable JSON: it holds an integer of 5000 digits, more than the 4300 digits Python reads"),
        (b'{"q": "A dog.", "source": "\\udfff", "target": "de"}', 400,
         "field 'source' is not valid Unicode: an unpaired surrogate \\udfff at character 1"),
        (b'{"q": "A dog', 400, "the body is not valid JSON: Unterminated string starting at line 1 column 7"),
        (b'\xef\xbb\xbf{"q": "A dog."}', 400, "the body starts with a UTF-8 byte-order mark"),
        (json.dumps({"q": "<p>A <b>dog</p>", "source": "en", "target": "de", "format": "html"}).encode(), 400,
         "q is not well-formed HTML: </p> at line 1 column 12 closes <p> (line 1 column 1) while <b> (line 1 "
         "column 6) inside it is still open"),
        (json.dumps({"q": "A dog.", "source": "en", "target": "de", "alternatives": BEAM}).encode(), 422,
         f"field 'alternatives' is {BEAM}, more than the {BEAM - 1} other hypotheses"),
    ],
)
def test_inputs_that_once_got_a_500_or_a_confusing_message_get_a_4xx_naming_the_problem(service, body, status,
                                                                                        message):
    answer_status, answer = send(service, "/translate", body, {"Content-Type": "application/json"})
    assert answer_status == status and answer["error"].startswith(message)


def test_the_schema_documents_every_body_and_no_request_here_got_a_5xx(service):
    schema = json.loads(service.get("/openapi.json")[1])
    for path in ("/translate", "/detect"):
        body = schema["paths"][path]["post"]["requestBody"]["content"]
        assert set(body) == {"application/json", "application/x-www-form-urlencoded", "multipart/form-data"}
    # 408: the body did not arrive within --body-timeout-s (answered by the HTTP layer, documented here).
    assert set(schema["paths"]["/translate"]["post"]["responses"]) == {"200", "400", "408", "413", "415", "422",
                                                                        "503", "504"}
    text = service.get("/metrics")[1].decode()
    statuses = re.findall(r'^mtpipe_serve_requests_total\{endpoint="[^"]*",status="(\d+)"\}', text, re.MULTILINE)
    assert "200" in statuses and not [s for s in statuses if s.startswith("5")]
