"""pipeline/runtime/serve/batcher.py on a scripted translate function: which lines share a batch, when a batch leaves,
what a cancelled or refused request costs. No model: "translating" a line of ids gives the text of its ids, and
every batch the workers get is recorded."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from pipeline.runtime.serve.batcher import Batcher, NotRunning, QueueFull
from pipeline.runtime.serve.metrics import ServiceMetrics


class ScriptedTranslate:
    """Records each batch (its sources and target); can hold the workers until released, or fail on a marker id."""

    FAIL = -1

    def __init__(self, hold: bool = False, seconds: float = 0.0):
        self.batches: list[tuple[list[list[int]], str]] = []
        self.released = threading.Event()
        if not hold:
            self.released.set()
        self.seconds = seconds
        self._lock = threading.Lock()

    def __call__(self, sources: Sequence[Sequence[int]], target: str) -> list[str]:
        with self._lock:
            self.batches.append(([list(s) for s in sources], target))
        self.released.wait(10)
        time.sleep(self.seconds)
        if any(self.FAIL in s for s in sources):
            raise RuntimeError("scripted failure")
        return [f"{target}:{' '.join(map(str, s))}" for s in sources]

    def lines(self) -> list[list[int]]:
        return [line for sources, _ in self.batches for line in sources]


def text(ids: list[int], target: str = "de") -> str:
    return f"{target}:{' '.join(map(str, ids))}"


def make(translate: ScriptedTranslate, **settings) -> tuple[Batcher, ServiceMetrics]:
    metrics = ServiceMetrics()
    options = {"workers": 1, "max_batch_tokens": 1000, "max_wait_s": 0.0, "max_queued_lines": 1000, **settings}
    return Batcher(translate, metrics, **options), metrics


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_concurrent_requests_share_one_batch_and_each_gets_its_own_lines_in_order():
    translate = ScriptedTranslate()
    batcher, _ = make(translate, max_wait_s=0.2)

    async def scenario():
        await batcher.start()
        jobs = [batcher.submit([[1, 2], [3]], "de"), batcher.submit([[4]], "de"), batcher.submit([[5, 6, 7]], "de")]
        results = await asyncio.gather(*(job.future for job in jobs))
        await batcher.stop()
        return results

    results = run(scenario())
    assert results == [[text([1, 2]), text([3])], [text([4])], [text([5, 6, 7])]]
    assert len(translate.batches) == 1 and translate.lines() == [[1, 2], [3], [4], [5, 6, 7]]


def test_a_lone_request_waits_at_most_max_wait_for_company():
    translate = ScriptedTranslate()
    batcher, _ = make(translate, max_wait_s=0.05)

    async def scenario():
        await batcher.start()
        started = time.perf_counter()
        result = await batcher.submit([[1]], "de").future
        elapsed = time.perf_counter() - started
        await batcher.stop()
        return result, elapsed

    result, elapsed = run(scenario())
    assert result == [text([1])]
    assert 0.05 <= elapsed < 2.0


def test_a_full_batch_leaves_without_waiting():
    translate = ScriptedTranslate()
    batcher, _ = make(translate, max_wait_s=20.0, max_batch_tokens=4)

    async def scenario():
        await batcher.start()
        result = await batcher.submit([[1, 2], [3, 4]], "de").future
        await batcher.stop()
        return result

    assert run(scenario()) == [text([1, 2]), text([3, 4])]  # within the 30 s of run(), not after 20 s


def test_batches_keep_within_the_token_budget_and_a_request_may_span_several():
    translate = ScriptedTranslate()
    batcher, metrics = make(translate, max_batch_tokens=4)
    lines = [[1, 1], [2, 2], [3, 3], [4, 4, 4, 4, 4]]

    async def scenario():
        await batcher.start()
        result = await batcher.submit(lines, "de").future
        await batcher.stop()
        return result

    assert run(scenario()) == [text(line) for line in lines]
    assert [sources for sources, _ in translate.batches] == [[[1, 1], [2, 2]], [[3, 3]], [[4, 4, 4, 4, 4]]]
    assert metrics.registry.get_sample_value("mtpipe_serve_batch_lines_count") == 3
    assert metrics.registry.get_sample_value("mtpipe_serve_sentences_total") == 4
    assert metrics.registry.get_sample_value("mtpipe_serve_source_tokens_total") == 11


def test_idle_workers_share_the_queue_instead_of_one_taking_it_all():
    translate = ScriptedTranslate(seconds=0.05)
    batcher, _ = make(translate, workers=2)

    async def scenario():
        await batcher.start()
        result = await batcher.submit([[1, 1], [2, 2], [3, 3], [4, 4]], "de").future
        await batcher.stop()
        return result

    run(scenario())
    assert sorted(len(sources) for sources, _ in translate.batches) == [2, 2]


def test_a_batch_holds_one_target_language():
    translate = ScriptedTranslate()
    batcher, _ = make(translate, max_wait_s=0.1)

    async def scenario():
        await batcher.start()
        jobs = [batcher.submit([[1]], "de"), batcher.submit([[2]], "fr"), batcher.submit([[3]], "de")]
        results = await asyncio.gather(*(job.future for job in jobs))
        await batcher.stop()
        return results

    assert run(scenario()) == [[text([1], "de")], [text([2], "fr")], [text([3], "de")]]
    assert sorted((target, sources) for sources, target in translate.batches) == [("de", [[1], [3]]),
                                                                                  ("fr", [[2]])]


def test_the_lines_of_a_cancelled_request_that_had_not_started_are_never_decoded():
    translate = ScriptedTranslate(hold=True)
    batcher, metrics = make(translate, max_batch_tokens=1)

    async def scenario():
        await batcher.start()
        first = batcher.submit([[1]], "de")
        while not translate.batches:  # the worker holds [1]
            await asyncio.sleep(0.01)
        second = batcher.submit([[2], [3], [4]], "de")
        batcher.cancel(second, "disconnect")
        translate.released.set()
        result = await first.future
        await batcher.stop()
        return result, second

    result, second = run(scenario())
    assert result == [text([1])]
    assert second.future.cancelled()
    assert translate.lines() == [[1]]
    assert metrics.registry.get_sample_value("mtpipe_serve_dropped_lines_total", {"reason": "disconnect"}) == 3
    assert metrics.registry.get_sample_value("mtpipe_serve_queued_lines") == 0


def test_a_request_that_would_overfill_the_queue_is_refused_at_once():
    translate = ScriptedTranslate(hold=True)
    batcher, _ = make(translate, max_queued_lines=3)

    async def scenario():
        await batcher.start()
        held = batcher.submit([[1]], "de")
        while not translate.batches:
            await asyncio.sleep(0.01)
        queued = batcher.submit([[2], [3]], "de")
        with pytest.raises(QueueFull, match="2 lines are waiting and this request adds 2: over the queue limit of 3"):
            batcher.submit([[4], [5]], "de")
        fits = batcher.submit([[6]], "de")
        translate.released.set()
        results = await asyncio.gather(held.future, queued.future, fits.future)
        await batcher.stop()
        return results

    assert run(scenario()) == [[text([1])], [text([2]), text([3])], [text([6])]]


def test_a_failing_batch_fails_its_requests_and_the_next_ones_are_served():
    translate = ScriptedTranslate()
    batcher, _ = make(translate)

    async def scenario():
        await batcher.start()
        failed = batcher.submit([[ScriptedTranslate.FAIL]], "de")
        with pytest.raises(RuntimeError, match="scripted failure"):
            await failed.future
        result = await batcher.submit([[7]], "de").future
        running = batcher.running
        await batcher.stop()
        return result, running

    assert run(scenario()) == ([text([7])], True)


def test_stop_lets_the_batches_in_flight_finish_and_then_refuses_new_requests():
    translate = ScriptedTranslate(seconds=0.2)
    batcher, _ = make(translate)

    async def scenario():
        await batcher.start()
        job = batcher.submit([[1]], "de")
        while not translate.batches:
            await asyncio.sleep(0.01)
        await batcher.stop()
        assert job.future.done()
        with pytest.raises(NotRunning):
            batcher.submit([[2]], "de")
        return job.future.result()

    assert run(scenario()) == [text([1])]
