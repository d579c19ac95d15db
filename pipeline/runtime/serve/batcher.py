"""The queue that coalesces lines across requests into batches, decoded on worker threads off the event loop.

Each request is a `Job`: its lines' source ids, queued in arrival order. One dispatcher task forms batches:

- only when a worker is free (`workers` batches are decoded at once, each on its own thread);
- from the oldest lines first, a request's lines in order, all of one target language;
- once the queued lines hold `max_batch_tokens` source tokens, or once the oldest has waited `max_wait_s`
  (so a lone request waits at most that long, and under load, lines pile up while the workers are busy and the
  next batch is full at once);
- no bigger than the queued tokens split evenly over the free workers, so idle workers share the queue rather than
  one taking it all; a request's lines may go to several batches and so be decoded in parallel.

A request's translations are the same whichever lines share its batches: the Translator decodes fp32 batches
line-independently (per-sentence length limits, no cross-row interaction in the graphs).

Cancelling a job (its client disconnected, or its deadline passed) takes its lines that have not started off the
queue: they are never decoded. Lines already in a batch finish with it (a batch holds other requests' lines and
ONNX Runtime cannot stop one row), and their results are dropped. `submit` refuses a job that would take the
queue over `max_queued_lines` (QueueFull), so a flood of requests is answered at once instead of timing out later.

All of the state is on the event loop's thread; the worker threads only run `translate`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pipeline.runtime.serve.metrics import ServiceMetrics

log = logging.getLogger("mtpipe.serve")

# translate(sources, target) -> one text per source, in order; runs on a worker thread.
TranslateBatch = Callable[[Sequence[Sequence[int]], str], list[str]]


class QueueFull(Exception):
    def __init__(self, queued: int, incoming: int, limit: int):
        super().__init__(f"{queued} lines are waiting and this request adds {incoming}: over the queue limit of "
                         f"{limit} lines")
        self.queued, self.incoming, self.limit = queued, incoming, limit


class NotRunning(Exception):
    """The batcher is not started, or is stopping."""


@dataclass(eq=False)
class Job:
    """One request's lines. `future` gets the translations in order, or is cancelled."""

    sources: list[list[int]]
    target: str
    enqueued_at: float
    future: asyncio.Future
    translations: list[str | None]
    taken: int = 0  # lines handed to batches so far; lines are taken in order
    finished: int = 0

    @property
    def done(self) -> bool:
        return self.future.done()


@dataclass
class Batch:
    target: str
    sources: list[list[int]] = field(default_factory=list)
    origins: list[tuple[Job, int]] = field(default_factory=list)  # (job, line index) per source
    tokens: int = 0


class Batcher:
    def __init__(self, translate: TranslateBatch, metrics: ServiceMetrics, *, workers: int, max_batch_tokens: int,
                 max_wait_s: float, max_queued_lines: int):
        self.translate = translate
        self.metrics = metrics
        self.workers = workers
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self.max_queued_lines = max_queued_lines
        self._queue: deque[Job] = deque()  # jobs with lines not yet taken, oldest first
        self._queued_lines = 0
        self._queued_tokens: dict[str, int] = {}  # per target
        self._busy = 0
        self._in_flight: set[asyncio.Future] = set()
        self._changed = asyncio.Event()  # set on submit, cancel and batch completion: the dispatcher looks again
        self._dispatcher: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def running(self) -> bool:
        return self._dispatcher is not None and not self._dispatcher.done()

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="mtpipe-decode")
        self._dispatcher = asyncio.create_task(self._dispatch_forever(), name="mtpipe-batcher")
        self._dispatcher.add_done_callback(_log_failure)

    async def stop(self) -> None:
        """Stop forming batches, let the batches in flight finish, cancel what is still queued."""
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
        for job in list(self._queue):
            self.cancel(job, "shutdown")
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def submit(self, sources: list[list[int]], target: str) -> Job:
        """Queue a request's lines (at least one); QueueFull if that would take the queue over its limit."""
        if not self.running:
            raise NotRunning("the batcher is not running")
        if self._queued_lines + len(sources) > self.max_queued_lines:
            raise QueueFull(self._queued_lines, len(sources), self.max_queued_lines)
        loop = asyncio.get_running_loop()
        job = Job(list(sources), target, loop.time(), loop.create_future(), [None] * len(sources))
        self._queue.append(job)
        self._count_queued(job, len(job.sources), sum(map(len, job.sources)))
        self._changed.set()
        return job

    def cancel(self, job: Job, reason: str) -> None:
        """Drop a job: its lines not yet in a batch are never decoded (counted as dropped for `reason`)."""
        if job.done:
            return
        job.future.cancel()
        untaken = self._unqueue(job)
        if untaken:
            self.metrics.dropped_lines.labels(reason=reason).inc(untaken)

    def _unqueue(self, job: Job) -> int:
        """Take a job's lines not yet in a batch off the queue; how many there were."""
        untaken = job.sources[job.taken :]
        if job in self._queue:
            self._queue.remove(job)
            self._count_queued(job, -len(untaken), -sum(map(len, untaken)))
            self._changed.set()
        return len(untaken)

    # ----------------------------------------------------------------------------------------------- dispatching

    async def _dispatch_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            head = self._queue[0] if self._queue else None
            if head is None or self._busy >= self.workers:
                await self._wait_for_change()
                continue
            queued = self._queued_tokens[head.target]
            fill_by = head.enqueued_at + self.max_wait_s
            if queued < self.max_batch_tokens and loop.time() < fill_by:
                await self._wait_for_change(fill_by - loop.time())
                continue
            free = self.workers - self._busy
            budget = min(self.max_batch_tokens, max(-(-queued // free), 1))
            self._launch(self._take(head.target, budget))

    async def _wait_for_change(self, timeout: float | None = None) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _take(self, target: str, budget: int) -> Batch:
        """The oldest queued lines of `target`, in order, while they fit in `budget` tokens (at least one line)."""
        batch = Batch(target)
        for job in list(self._queue):
            if job.target != target:
                continue
            while job.taken < len(job.sources):
                ids = job.sources[job.taken]
                if batch.sources and batch.tokens + len(ids) > budget:
                    return batch
                batch.sources.append(ids)
                batch.origins.append((job, job.taken))
                batch.tokens += len(ids)
                job.taken += 1
                self._count_queued(job, -1, -len(ids))
            self._queue.remove(job)
        return batch

    def _count_queued(self, job: Job, lines: int, tokens: int) -> None:
        self._queued_lines += lines
        self._queued_tokens[job.target] = self._queued_tokens.get(job.target, 0) + tokens
        self.metrics.queued_lines.set(self._queued_lines)

    def _launch(self, batch: Batch) -> None:
        self._busy += 1
        self.metrics.busy_workers.set(self._busy)
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, _timed_translate, self.translate, batch.sources, batch.target
        )
        self._in_flight.add(future)
        future.add_done_callback(lambda done: self._finish(batch, done))

    def _finish(self, batch: Batch, done: asyncio.Future) -> None:
        """On the event loop, when a worker returns: hand each line's translation to its job."""
        self._in_flight.discard(done)
        self._busy -= 1
        self.metrics.busy_workers.set(self._busy)
        self._changed.set()
        error = done.exception()
        if error is not None:
            log.error("decoding a batch of %d lines failed", len(batch.sources), exc_info=error)
            for job, _ in batch.origins:
                if not job.done:
                    job.future.set_exception(error)
                    self._unqueue(job)
            return
        translations, seconds = done.result()
        self.metrics.batch_done(len(batch.sources), batch.tokens, seconds)
        for (job, index), text in zip(batch.origins, translations, strict=True):
            if job.done:
                continue
            job.translations[index] = text
            job.finished += 1
            if job.finished == len(job.sources):
                job.future.set_result(job.translations)


def _timed_translate(translate: TranslateBatch, sources: list[list[int]], target: str) -> tuple[list[str], float]:
    started = time.perf_counter()
    translations = translate(sources, target)
    return translations, time.perf_counter() - started


def _log_failure(dispatcher: asyncio.Task) -> None:
    # A failed dispatcher forms no more batches: /ready turns 503 (Batcher.running), and the log says why.
    if not dispatcher.cancelled() and dispatcher.exception() is not None:
        log.error("the batcher stopped", exc_info=dispatcher.exception())
