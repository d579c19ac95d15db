"""uvicorn around the application: load the model, bind, serve until SIGTERM/SIGINT, shut down gracefully.

The model is loaded before the socket is bound, so a bad export directory is an error naming it, and nothing
listens until requests can be translated. Connections are served by pipeline/runtime/serve/http_protocol.py (uvicorn's
h11 protocol with read timeouts, a connection cap and JSON errors). On SIGTERM (`docker stop`) or SIGINT, uvicorn stops
accepting connections, closes idle keep-alive ones and half-sent requests, lets the requests in flight finish (each
is bounded by the request deadline, so the wait is too), then the lifespan stops the batcher; the process then
ends by the signal, as uvicorn re-raises it (status 143 for SIGTERM in a shell or container).
"""

from __future__ import annotations

import logging
import math
import resource
import socket
from typing import TYPE_CHECKING

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.serve.settings import ServeSettings, SettingsError, flag

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

log = logging.getLogger("mtpipe.serve")

# Past the request deadline, in-flight requests have been answered (504) already; this is the margin for that.
SHUTDOWN_MARGIN_S = 5
# Open files besides the connections under the cap: the model's, the log's, and connections over the cap that
# wait for their 503.
FILE_HEADROOM = 256


def serve(settings: ServeSettings) -> None:
    """Run the service until a signal stops it. PipelineError (the export, a setting) before anything listens."""
    allow_open_files(settings.max_connections)
    import uvicorn

    from pipeline.runtime.serve.app import create_app
    from pipeline.runtime.serve.engine import TranslationEngine

    engine = TranslationEngine.load(settings)
    config = uvicorn_config(create_app(engine, settings), settings)
    listener = bind(settings.host, settings.port)  # here rather than in uvicorn: port 0 is logged as the one it got
    host, port = listener.getsockname()[:2]
    # tests/service_process.py (the launcher the e2e tests and bench/serve.py use) finds the URL in this line.
    log.info("serving %s (%s, beam %d, %d workers) on http://%s:%d", engine.model_dir,
             "int8" if settings.int8 else "fp32", engine.beam, settings.workers, host, port)
    uvicorn.Server(config).run(sockets=[listener])


def uvicorn_config(app: ASGIApp, settings: ServeSettings) -> uvicorn.Config:
    """How uvicorn runs the application: HTTP/1.1 on h11 with the service's limits, no WebSocket upgrades."""
    import uvicorn

    from pipeline.runtime.serve.http_protocol import MAX_HEAD_BYTES, LimitedH11Protocol, answer_json_when_cancelled

    return uvicorn.Config(
        answer_json_when_cancelled(app),
        host=settings.host,
        port=settings.port,
        http=LimitedH11Protocol.factory(settings),  # type: ignore[arg-type]  # a partial of the class
        ws="none",  # an Upgrade: websocket request is served as plain HTTP (the API has no WebSocket route)
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        loop="asyncio",
        lifespan="on",
        access_log=settings.access_log,
        timeout_graceful_shutdown=math.ceil(settings.request_timeout_s) + SHUTDOWN_MARGIN_S,
        log_config=None,  # the logging set up by the command line (one format for uvicorn's and ours)
    )


def allow_open_files(max_connections: int) -> None:
    """Raise the soft limit on open files to what max_connections needs if it is lower (a connection is a file),
    within the hard limit; SettingsError naming --max-connections when the hard limit is lower still."""
    needed = max_connections + FILE_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SettingsError(
            f"{flag('max_connections')} {max_connections} needs {needed} open files, more than this process "
            f"may open ({hard}, `ulimit -Hn`): lower {flag('max_connections')} or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not listening yet); PipelineError naming the address when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0 (uvicorn's own bind_socket passes 0): asyncio sets TCP_NODELAY only on the connections of
    # a socket that says it is TCP, and without it the body of every response after the first on a keep-alive
    # connection waits for the client's delayed ACK of the headers.
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as err:
        listener.close()
        raise PipelineError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return listener
