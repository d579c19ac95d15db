"""The Prometheus metrics of one service, in their own registry (not prometheus_client's process-wide one, so two
services in one process, as in tests, do not share counts). `GET /metrics` serves them in the text format.

Rates are counters, as Prometheus expects: sentences per second is `rate(mtpipe_serve_sentences_total[1m])`,
source tokens per second `rate(mtpipe_serve_source_tokens_total[1m])`.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LINE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("mtpipe_serve_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=registry)
        self.latency = Histogram("mtpipe_serve_request_seconds", "Time from request to response, by endpoint",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=registry)
        self.batch_lines = Histogram("mtpipe_serve_batch_lines", "Lines per decoded batch (across requests)",
                                     buckets=LINE_BUCKETS, registry=registry)
        self.batch_tokens = Histogram("mtpipe_serve_batch_tokens", "Source tokens per decoded batch",
                                      buckets=TOKEN_BUCKETS, registry=registry)
        self.batch_seconds = Histogram("mtpipe_serve_batch_seconds", "Decoding time per batch",
                                       buckets=LATENCY_BUCKETS, registry=registry)
        self.sentences = Counter("mtpipe_serve_sentences", "Lines translated", registry=registry)
        self.source_tokens = Counter("mtpipe_serve_source_tokens", "Source tokens of the lines translated",
                                     registry=registry)
        self.dropped_lines = Counter("mtpipe_serve_dropped_lines",
                                     "Queued lines dropped before decoding, by reason (deadline, disconnect, ...)",
                                     ["reason"], registry=registry)
        self.queued_lines = Gauge("mtpipe_serve_queued_lines", "Lines waiting for a worker", registry=registry)
        self.busy_workers = Gauge("mtpipe_serve_busy_workers", "Workers decoding a batch now", registry=registry)

    def batch_done(self, lines: int, tokens: int, seconds: float) -> None:
        self.batch_lines.observe(lines)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)
        self.sentences.inc(lines)
        self.source_tokens.inc(tokens)

    def request_done(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.latency.labels(endpoint=endpoint).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the text format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
