"""What a training run knows about itself as it goes: the explicit state the loop's functions read and update.

The fields above the line are the run's progress; checkpoints carry them (as the plain dict `progress()` makes,
under "progress" in last.pt), so a resumed run continues with the same counters, limits, early-stopping patience,
curves and log window. The fields below it live only while the process runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class Window:
    """Figures summed since the last log line (its loss sum stays on the device: TrainState.window_loss)."""

    tgt: int = 0  # real target tokens
    src: int = 0  # real source tokens
    padded: int = 0  # tokens the model computed on, padding included, both sides
    seconds: float = 0.0  # wall time spent training (validation, checkpoints and logging left out)
    updates: int = 0


@dataclass
class TrainState:
    step: int = 0  # optimizer updates taken (a skipped non-finite update does not count)
    epoch: int = 1
    update_in_epoch: int = 0  # updates consumed from this epoch's batch list, skipped ones included
    train_seconds: float = 0.0  # training time so far, across resumes (what train.max_minutes limits)
    skipped_updates: int = 0
    best_valid_loss: float = math.inf
    best_step: int = 0
    best_valid_bleu: float | None = None
    stale_validations: int = 0  # validations in a row without a lower valid loss (early stopping)
    last_validated: int = 0
    last_saved: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # every logged row, replayed on resume
    window: Window = field(default_factory=Window)
    # ---- not saved ----
    window_loss: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    bad_in_a_row: int = 0  # non-finite updates in a row
    last_grad_norm: float = math.nan
    resumed_from_step: int | None = None
    clock_origin: float = field(default_factory=time.perf_counter)  # perf_counter() at train_seconds == 0
    window_mark: float = field(default_factory=time.perf_counter)  # where the window's training time resumes

    @classmethod
    def start(cls, device: torch.device, progress: dict[str, Any] | None = None) -> TrainState:
        """A fresh state, or the one a checkpoint's progress describes; the clocks start now."""
        if progress is None:
            state = cls()
        else:
            saved = dict(progress)
            window = dict(saved.pop("window"))
            loss = window.pop("loss")
            state = cls(**saved, window=Window(**window), window_loss=torch.tensor(loss, dtype=torch.float64))
            state.resumed_from_step = state.step or None
        state.window_loss = state.window_loss.to(device)
        state.clock_origin = time.perf_counter() - state.train_seconds
        state.window_mark = time.perf_counter()
        return state

    def progress(self) -> dict[str, Any]:
        """The saved fields as plain data (a host sync: the window's loss sum is read from the device)."""
        saved = {name: getattr(self, name) for name in PROGRESS_FIELDS}
        saved["history"] = list(self.history)
        saved["window"] = {**asdict(self.window), "loss": self.window_loss.item()}
        return saved

    def seconds(self) -> float:
        """Training time across resumes."""
        return time.perf_counter() - self.clock_origin


PROGRESS_FIELDS = ("step", "epoch", "update_in_epoch", "train_seconds", "skipped_updates", "best_valid_loss",
                   "best_step", "best_valid_bleu", "stale_validations", "last_validated", "last_saved")
