"""The ASGI application: routes, error responses and lifespan, over a TranslationEngine and a Batcher.

    POST /translate   LibreTranslate's fields {q, source, target, format, alternatives} (JSON, a form, or the query
                      string) -> {translatedText, detectedLanguage (source "auto"), alternatives (when asked)}
    POST /detect      {q} -> [{confidence, language}], the model's source languages q is most likely in
    GET  /languages   [{code, name, targets}]
    GET  /health      200 while the process serves (liveness)
    GET  /ready       200 once the model is loaded and the batcher runs, else 503 (readiness)
    GET  /metrics     Prometheus text format
    GET  /docs        the API's page (Swagger UI, from vendored files: docs.py); /openapi.json the schema

Every error is `{"error": message}` with a 4xx status for bad input (pipeline/runtime/serve/translate_request.py lists
them), 503 when the queue is full, 504 past the request deadline, 500 only for a fault of the service itself. A
request whose client disconnects is dropped (its queued lines are never decoded) and counted as status 499,
nginx's "client closed request".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline.runtime.serve.batcher import Batcher, Job, NotRunning, QueueFull
from pipeline.runtime.serve.docs import add_docs
from pipeline.runtime.serve.engine import TranslationEngine
from pipeline.runtime.serve.errors import ApiError, DeadlineExceeded, Overloaded
from pipeline.runtime.serve.metrics import ServiceMetrics
from pipeline.runtime.serve.request_fields import read_fields
from pipeline.runtime.serve.schema import (
    DetectedLanguage,
    DetectRequest,
    ErrorResponse,
    Language,
    TranslateRequest,
    TranslateResponse,
    openapi_request,
)
from pipeline.runtime.serve.settings import ServeSettings, flag
from pipeline.runtime.serve.translate_request import (
    DETECT_FIELDS,
    TRANSLATE_FIELDS,
    detections,
    parse_detect_fields,
    parse_fields,
    prepare,
)

log = logging.getLogger("mtpipe.serve")

CLIENT_CLOSED_REQUEST = 499
ENDPOINTS = ("/translate", "/detect", "/languages", "/health", "/ready", "/metrics", "/docs", "/openapi.json")
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in [
        (400, "invalid UTF-8, JSON, form or Unicode, malformed HTML, or a language this model does not translate"),
        (408, "the body did not all come within --body-timeout-s of the headers (the connection is closed)"),
        (413, "over a limit: body bytes, lines per request or tokens per line (the message names the flag)"),
        (415, "a body that is not JSON, an urlencoded form or a multipart form"),
        (422, "a missing field, a wrong type, an empty list, a field given twice, or more alternatives than the "
              "beam keeps"),
        (503, "the queue is full, or the service is stopping: retry after Retry-After seconds"),
        (504, "not translated within the request deadline"),
    ]
}
DETECT_ERRORS = {status: ERROR_RESPONSES[status] for status in (400, 408, 413, 415, 422)}


@dataclass(frozen=True)
class Service:
    engine: TranslationEngine
    settings: ServeSettings
    batcher: Batcher
    metrics: ServiceMetrics


def create_app(engine: TranslationEngine, settings: ServeSettings) -> FastAPI:
    metrics = ServiceMetrics()
    batcher = Batcher(engine.translate, metrics, workers=settings.workers, max_batch_tokens=settings.max_batch_tokens,
                      max_wait_s=settings.max_wait_s, max_queued_lines=settings.max_queued_lines)
    # /docs from the vendored Swagger UI (docs.py) instead of FastAPI's CDN page; no ReDoc page.
    app = FastAPI(title="mtpipe translate", summary="Machine translation with an exported mtpipe model",
                  lifespan=_lifespan, docs_url=None, redoc_url=None)
    add_docs(app)
    app.state.service = Service(engine, settings, batcher, metrics)
    # The fields are read by the handlers (request_fields.py), so FastAPI is told their schemas for the docs.
    app.add_api_route("/translate", translate, methods=["POST"], response_model=TranslateResponse,
                      responses=ERROR_RESPONSES, openapi_extra=openapi_request(TranslateRequest),
                      summary="Translate a string or a list of strings (LibreTranslate's API)")
    app.add_api_route("/detect", detect_language, methods=["POST"], response_model=list[DetectedLanguage],
                      responses=DETECT_ERRORS, openapi_extra=openapi_request(DetectRequest),
                      summary="The model's source languages a text is most likely in (LibreTranslate's API)")
    app.add_api_route("/languages", languages, methods=["GET"], response_model=list[Language],
                      summary="Source languages and the targets each goes to")
    app.add_api_route("/health", health, methods=["GET"], summary="Liveness: 200 while the process serves")
    app.add_api_route("/ready", ready, methods=["GET"], summary="Readiness: 200 when requests can be translated",
                      responses={503: {"model": ErrorResponse}})
    app.add_api_route("/metrics", metrics_text, methods=["GET"], summary="Prometheus metrics (text format)",
                      response_class=PlainTextResponse)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    service: Service = app.state.service
    await service.batcher.start()
    try:
        yield
    finally:
        # uvicorn gets here after the requests in flight were answered (graceful shutdown).
        await service.batcher.stop()


# --------------------------------------------------------------------------------------------------- routes


async def translate(request: Request) -> Response:
    service: Service = request.app.state.service
    deadline = asyncio.get_running_loop().time() + service.settings.request_timeout_s
    fields = await read_fields(request, service.settings.max_request_bytes, TRANSLATE_FIELDS)
    prepared = prepare(parse_fields(fields), service.engine, service.settings)
    present = [ids for ids in prepared.sources if ids is not None]
    translations: list[str] = []
    if present:
        try:
            job = service.batcher.submit(present, prepared.target)
        except QueueFull as err:
            raise Overloaded(f"{err}: retry later, or raise {flag('max_queued_lines')}") from None
        except NotRunning:
            raise Overloaded("the service is not ready (starting or stopping)") from None
        outcome = await _wait_for(service.batcher, job, request.receive, deadline, service.settings.request_timeout_s)
        if outcome is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        translations = outcome
    remaining = iter(translations)
    texts = ["" if ids is None else next(remaining) for ids in prepared.sources]
    return JSONResponse(prepared.response(texts))


async def detect_language(request: Request) -> Response:
    service: Service = request.app.state.service
    fields = await read_fields(request, service.settings.max_request_bytes, DETECT_FIELDS)
    return JSONResponse(detections(parse_detect_fields(fields), service.engine, service.settings))


async def _wait_for(batcher: Batcher, job: Job, receive: Receive, deadline: float,
                    timeout_s: float) -> list[str] | None:
    """The job's translations; None if the client disconnected first; DeadlineExceeded past the deadline. Either
    way the job's lines not yet decoded are dropped, also when this task is cancelled (a forced shutdown)."""
    disconnected = asyncio.ensure_future(_disconnect(receive))
    try:
        timeout = max(deadline - asyncio.get_running_loop().time(), 0.0)
        done, _ = await asyncio.wait({job.future, disconnected}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if job.future in done:
            if job.future.cancelled():  # by Batcher.stop: the service is stopping past its grace period
                raise Overloaded("the service is stopping")
            return job.future.result()
        if disconnected in done:
            batcher.cancel(job, "disconnect")
            return None
        batcher.cancel(job, "deadline")
        raise DeadlineExceeded(
            f"not translated within the request deadline of {timeout_s:g} s ({flag('request_timeout_s')}): "
            f"{job.finished} of {len(job.sources)} lines were done, the rest were dropped"
        )
    finally:
        disconnected.cancel()
        batcher.cancel(job, "cancelled")


async def _disconnect(receive: Receive) -> None:
    """Returns when the client has gone. After the body, the server's receive() waits for the disconnect event (an
    http.request message can still come first, e.g. when a pipelined request arrives: it is skipped)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def languages(request: Request) -> list[dict[str, object]]:
    return request.app.state.service.engine.languages.listing()


async def health() -> dict[str, str]:
    return {"status": "alive"}


async def ready(request: Request) -> Response:
    service: Service = request.app.state.service
    if not service.batcher.running:
        return JSONResponse({"error": "not ready: the batcher is not running"}, status_code=503)
    return JSONResponse({"status": "ready", "model": service.engine.model_dir,
                         "precision": "int8" if service.settings.int8 else "fp32", "beam": service.engine.beam,
                         "workers": service.settings.workers})


async def metrics_text(request: Request) -> Response:
    body, content_type = request.app.state.service.metrics.exposition()
    return Response(body, media_type=content_type)


# --------------------------------------------------------------------------------------------------- errors


async def _api_error(request: Request, err: Exception) -> Response:
    assert isinstance(err, ApiError)
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


async def _http_error(request: Request, err: Exception) -> Response:
    assert isinstance(err, HTTPException)
    return JSONResponse({"error": str(err.detail)}, status_code=err.status_code, headers=err.headers)


async def _validation_error(request: Request, err: Exception) -> Response:
    assert isinstance(err, RequestValidationError)
    messages = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()]
    return JSONResponse({"error": "; ".join(messages)}, status_code=422)


async def _client_gone(request: Request, err: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _internal_error(request: Request, err: Exception) -> Response:
    # Not bad input (that is an ApiError): a fault of the service, logged with its traceback by the server.
    return JSONResponse({"error": f"internal error: {type(err).__name__} (see the service log)"}, status_code=500)


class RequestMetrics:
    """ASGI middleware: every HTTP request's status and latency into the metrics (500 if the app raised)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_note_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
            self.metrics.request_done(endpoint, status, time.perf_counter() - started)
