"""uvicorn around the application: load the model, bind, serve until SIGTERM/SIGINT, shut down gracefully.

The model is loaded before the socket is bound, so a bad export directory is an error naming it, and nothing
listens until requests can be translated. On SIGTERM (`docker stop`) or SIGINT, uvicorn stops accepting
connections, closes idle keep-alive ones, lets the requests in flight finish (each is bounded by the request
deadline, so the wait is too), then the lifespan stops the batcher; the process then ends by the signal, as
uvicorn re-raises it (status 143 for SIGTERM in a shell or container).
"""

from __future__ import annotations

import logging
import math
import socket

from pipeline.errors import PipelineError
from pipeline.serve.settings import ServeSettings

log = logging.getLogger("mtpipe.serve")

# Past the request deadline, in-flight requests have been answered (504) already; this is the margin for that.
SHUTDOWN_MARGIN_S = 5


def serve(settings: ServeSettings) -> None:
    """Run the service until a signal stops it. PipelineError (the export, a setting) before anything listens."""
    import uvicorn

    from pipeline.serve.app import create_app
    from pipeline.serve.engine import TranslationEngine

    engine = TranslationEngine.load(settings)
    app = create_app(engine, settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http="h11",
        loop="asyncio",
        lifespan="on",
        access_log=settings.access_log,
        timeout_graceful_shutdown=math.ceil(settings.request_timeout_s) + SHUTDOWN_MARGIN_S,
        log_config=None,  # the logging set up by the command line (one format for uvicorn's and ours)
    )
    listener = bind(settings.host, settings.port)  # here rather than in uvicorn: port 0 is logged as the one it got
    host, port = listener.getsockname()[:2]
    # pipeline/serve/child.py finds the URL in this line.
    log.info("serving %s (%s, beam %d, %d workers) on http://%s:%d", engine.model_dir,
             "int8" if settings.int8 else "fp32", engine.beam, settings.workers, host, port)
    uvicorn.Server(config).run(sockets=[listener])


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
