"""Every knob and limit of `mtpipe serve`, in one typed place, checked once before anything starts.

Each field is the command-line flag of the same name (`max_batch_tokens` is `--max-batch-tokens`), so an error
names the flag the user typed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from pipeline.runtime.errors import PipelineError


class SettingsError(PipelineError):
    """A setting out of its range; the message names the flag and the value."""


def flag(name: str) -> str:
    """The command-line flag of a settings field: max_batch_tokens -> --max-batch-tokens."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class ServeSettings:
    model_dir: Path
    int8: bool = False
    host: str = "127.0.0.1"
    # 0 binds a free port (the log names it).
    port: int = 8000
    # Batches decoded at once, one CPU thread each (CTranslate2's inter_threads): on a small model more batches
    # in parallel beat more threads per batch.
    workers: int = 2
    # Beam width; None takes the export's (the evaluate stage's setting).
    beam: int | None = None
    # Coalescing: a batch is dispatched once its lines hold this many source tokens, or once its oldest line has
    # waited max_wait_ms, whichever comes first (and only when a worker is free).
    max_batch_tokens: int = 2048
    max_wait_ms: float = 5.0
    # Per-request limits (413 above them).
    max_lines: int = 128
    # Source tokens per line (</s> included); None: as many as the model has positions.
    max_line_tokens: int | None = None
    max_request_bytes: int = 1 << 20
    # Load shedding: lines waiting for a worker across all requests; a request that would exceed it gets 503.
    max_queued_lines: int = 4096
    # A request not answered this long after it arrived gets 504, and its lines not yet decoded are dropped.
    request_timeout_s: float = 30.0
    # Slow and idle clients (pipeline/runtime/serve/http_protocol.py): a request head must be complete this long after
    # its connection opened or its previous response ended (else 408, or a silent close if nothing came), a body this
    # long after its head (else 408); a connection over max_connections gets 503. Each is closed after.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_connections: int = 512
    access_log: bool = False

    def __post_init__(self) -> None:
        minimum = {"workers": 1, "max_batch_tokens": 1, "max_lines": 1, "max_request_bytes": 1,
                   "max_queued_lines": 1, "beam": 1, "max_line_tokens": 2, "max_connections": 1}
        for name, least in minimum.items():
            value = getattr(self, name)
            if value is not None and value < least:
                raise SettingsError(f"{flag(name)} must be at least {least}, got {value}")
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"{flag('port')} must be within 0-65535, got {self.port}")
        if self.max_wait_ms < 0:
            raise SettingsError(f"{flag('max_wait_ms')} must not be negative, got {self.max_wait_ms}")
        for name in ("request_timeout_s", "header_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{flag(name)} must be positive, got {getattr(self, name)}")
        if self.max_queued_lines < self.max_lines:
            raise SettingsError(
                f"{flag('max_queued_lines')} ({self.max_queued_lines}) must be at least {flag('max_lines')} "
                f"({self.max_lines}): a request of max_lines lines could never be queued"
            )

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0


SETTING_NAMES = tuple(f.name for f in fields(ServeSettings))
