"""The input pipeline, overlapped with compute: the next updates' batches are built in a background thread.

While the device runs update k, a thread collates the micro-batches of updates k+1..k+depth (whole-batch numpy,
see batching.Collator) and, for a GPU, copies them into pinned (page-locked) host memory, so that the loop's
`.to(device, non_blocking=True)` is a real asynchronous DMA queued behind the running kernels instead of a
synchronous copy from pageable memory. Pinned blocks come from PyTorch's caching host allocator, which reuses a
block only once the copy that read it has finished.

The thread only reads the memory-mapped corpus and builds arrays; the order of the updates is fixed by the plan
(batching.planned_updates), so what the loop receives does not depend on timing: a run with prefetching takes
exactly the updates of a run without. An error in the thread is raised in the loop at the next update.
depth 0 builds each update in the caller's thread, when it is asked for (for measurements of the difference).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from stages.train.batching import Batch, PlannedUpdate

POLL_SECONDS = 0.1  # how often a blocked producer looks whether the loop has closed the feed


@dataclass
class ReadyUpdate:
    """A planned update with its micro-batches built: host tensors (pinned for a GPU), and their token counts."""

    plan: PlannedUpdate
    inputs: list[dict[str, torch.Tensor]]
    tgt_tokens: int
    src_tokens: int
    padded_tokens: int


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


_PLAN_ENDED = object()


class Prefetcher:
    def __init__(self, plan: Iterator[PlannedUpdate], collate: Callable[[np.ndarray], Batch],
                 device: torch.device, depth: int):
        self.plan, self.collate, self.device = plan, collate, device
        self.pin = device.type == "cuda"
        self.ready: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.closed = threading.Event()
        self.thread: threading.Thread | None = None
        if depth > 0:
            self.thread = threading.Thread(target=self._produce, name="mtpipe-batches", daemon=True)
            self.thread.start()

    def build(self, plan: PlannedUpdate) -> ReadyUpdate:
        batches = [self.collate(idx) for idx in plan.batches]
        inputs = []
        for batch in batches:
            tensors = {name: torch.from_numpy(a) for name, a in batch.arrays().items()}
            inputs.append({name: t.pin_memory() for name, t in tensors.items()} if self.pin else tensors)
        return ReadyUpdate(plan, inputs, sum(b.tgt_tokens for b in batches), sum(b.src_tokens for b in batches),
                           sum(b.padded_tokens for b in batches))

    def _produce(self) -> None:
        try:
            if self.pin:
                torch.cuda.set_device(self.device)  # pinned memory is allocated in this device's context
            for plan in self.plan:
                if not self._put(self.build(plan)):
                    return
            self._put(_PLAN_ENDED)
        except BaseException as err:  # handed to the loop, which raises it
            self._put(_Failed(err))

    def _put(self, item: object) -> bool:
        while not self.closed.is_set():
            try:
                self.ready.put(item, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> ReadyUpdate:
        if self.thread is None:
            return self.build(next(self.plan))
        if self.closed.is_set():
            raise StopIteration
        item = self.ready.get()
        if isinstance(item, _Failed):
            self.closed.set()
            raise item.error
        if item is _PLAN_ENDED:
            self.closed.set()
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the thread (it may be blocked on a full queue) and drop what it built ahead."""
        self.closed.set()
        if self.thread is not None:
            while self.thread.is_alive():
                try:
                    self.ready.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    pass
            self.thread.join()
