"""pipeline/runtime/serve/app.py in-process, called through ASGI with a stand-in engine: readiness follows the batcher,
a fault of the engine is a JSON 500 that the next request does not inherit, every answer is counted by status, and
serving imports no torch. On the real two-target export (en-de, en-fr): /languages lists both targets, a request is
translated into the target it names, and a target the model lacks is a 400 listing the ones it has.
(The real service over HTTP is tests/e2e/test_serve.py.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from pipeline.runtime.languages import Direction, Directions
from pipeline.runtime.serve.app import create_app
from pipeline.runtime.serve.languages import ServedLanguages
from pipeline.runtime.serve.settings import ServeSettings

REPO = Path(__file__).resolve().parents[2]


class ShoutingEngine:
    """Translates a line by upper-casing it; fails on "boom"."""

    languages = ServedLanguages(Directions.of(["en-de"]))
    max_line_tokens = 100
    beam = 1
    model_dir = "stand-in"

    def source_ids(self, line: str, direction: Direction) -> list[int]:
        return [ord(c) for c in line]

    def translate(self, sources: Sequence[Sequence[int]], target: str) -> list[str]:
        texts = ["".join(map(chr, ids)) for ids in sources]
        if "boom" in texts:
            raise RuntimeError("engine fault")
        return [t.upper() for t in texts]


async def call(app, method: str, path: str, body: object = None) -> tuple[int, object]:
    raw = b"" if body is None else json.dumps(body).encode()
    pending = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if pending:
            return pending.pop()
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    try:
        await app(scope, receive, send)
    except RuntimeError:  # Starlette re-raises an unhandled error after answering, for the server to log
        pass
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(content)


def make_app():
    return create_app(ShoutingEngine(), ServeSettings(model_dir=Path("stand-in"), max_wait_ms=0))


def test_ready_and_translate_answer_503_until_the_batcher_runs():
    app = make_app()

    async def scenario():
        before = [await call(app, "GET", "/ready"),
                  await call(app, "POST", "/translate", {"q": "hi", "source": "en", "target": "de"})]
        async with app.router.lifespan_context(app):
            during = [await call(app, "GET", "/ready"),
                      await call(app, "POST", "/translate", {"q": "hi", "source": "en", "target": "de"})]
        return before, during

    before, during = asyncio.run(scenario())
    assert before == [(503, {"error": "not ready: the batcher is not running"}),
                      (503, {"error": "the service is not ready (starting or stopping)"})]
    assert during == [(200, {"status": "ready", "model": "stand-in", "precision": "fp32", "beam": 1,
                             "workers": 2}), (200, {"translatedText": "HI"})]


def test_an_engine_fault_is_a_json_500_and_the_next_request_is_served():
    app = make_app()

    async def scenario():
        async with app.router.lifespan_context(app):
            fault = await call(app, "POST", "/translate", {"q": ["boom"], "source": "en", "target": "de"})
            after = await call(app, "POST", "/translate", {"q": ["a", "b"], "source": "en", "target": "de"})
            bad = await call(app, "POST", "/translate", {"q": [], "source": "en", "target": "de"})
        return fault, after, bad

    fault, after, bad = asyncio.run(scenario())
    assert fault == (500, {"error": "internal error: RuntimeError (see the service log)"})
    assert after == (200, {"translatedText": ["A", "B"]})
    assert bad[0] == 422
    metrics = app.state.service.metrics.registry
    for status, count in (("500", 1), ("200", 1), ("422", 1)):
        assert metrics.get_sample_value("mtpipe_serve_requests_total",
                                        {"endpoint": "/translate", "status": status}) == count


def test_serving_imports_neither_torch_nor_transformers():
    code = ("import sys, pipeline.tools.cli, pipeline.runtime.serve.server, pipeline.runtime.serve.app, "
            "pipeline.runtime.serve.engine, "
            "pipeline.runtime.translate; print([m for m in ('torch', 'transformers') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.e2e  # its fixture runs the export stage
def test_a_two_target_export_lists_its_targets_translates_into_each_and_refuses_others(two_target_exported):
    from pipeline.runtime.serve.engine import TranslationEngine
    from pipeline.runtime.translate import Translator

    settings = ServeSettings(model_dir=two_target_exported.export, max_wait_ms=0, beam=2)
    app = create_app(TranslationEngine.load(settings), settings)
    lines = ["Two dogs.", "People sit outside."]

    async def scenario():
        async with app.router.lifespan_context(app):
            listing = await call(app, "GET", "/languages")
            answers = {target: await call(app, "POST", "/translate", {"q": lines, "source": "auto", "target": target})
                       for target in ("de", "fr")}
            unknown = await call(app, "POST", "/translate", {"q": "Hi", "source": "en", "target": "cs"})
            wrong_source = await call(app, "POST", "/translate", {"q": "Hi", "source": "de", "target": "fr"})
        return listing, answers, unknown, wrong_source

    listing, answers, unknown, wrong_source = asyncio.run(scenario())
    assert listing == (200, [{"code": "en", "name": "English", "targets": ["de", "fr"]}])
    translator = Translator(two_target_exported.export, threads=1)
    for target, answer in answers.items():
        assert answer[0] == 200
        assert answer[1]["translatedText"] == translator.translate(lines, beam=2, tgt=target)
        assert [d["language"] for d in answer[1]["detectedLanguage"]] == ["en", "en"]
    assert unknown == (400, {"error": "target 'cs' is not one of this model's targets: de, fr (directions: en-de, "
                                      "en-fr)"})
    assert wrong_source == (400, {"error": "this model does not translate de-fr; its directions: en-de, en-fr"})

