"""The learning-rate schedule (`train.lr_schedule`): a factor of `train.lr` for each update.

- inverse_sqrt: linear warmup to 1, then decay with 1/sqrt(step) (Vaswani et al. 2017; fairseq's default for
  Transformers). It never ends, so a run may stop at any step, or be continued with a larger max_steps.
- linear: linear warmup to 1, then a straight line to 0 at train.max_steps.
- cosine: linear warmup to 1, then half a cosine to 0 at train.max_steps.

The two decaying schedules spend the whole budget: for a run bounded by its step count they train a better model
in the same updates than inverse_sqrt, whose learning rate is still high when the run stops (Li et al. 2020,
"Budgeted Training"; bench/README.md has the Multi30k figures). They tie the trajectory to max_steps: a decaying
run cannot be continued by raising it (checkpoint.py adds max_steps to what a resume must match), and a time or
epoch limit that stops it first would leave it undecayed (check_params refuses that).
"""

from __future__ import annotations

import math

DECAYING = ("linear", "cosine")


def lr_factor(schedule: str, step: int, warmup: int, max_steps: int) -> float:
    """The factor of the base learning rate for update `step` (1-based)."""
    step = max(step, 1)
    if warmup and step < warmup:
        return step / warmup
    if schedule == "inverse_sqrt":
        return math.sqrt(warmup / step) if warmup else 1.0
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r} (pipeline/params.py lists the schedules)")
