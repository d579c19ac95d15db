"""One resume decision for all ranks: rank 0 decides, every rank follows, and ranks that see different files stop.

Each rank deciding alone whether models/checkpoints/last.pt resumes can split a run: without a shared checkpoint
directory, or with a stale file on one node, some ranks would continue at update N while others start at 0 and
enter different collectives (a hang). So rank 0 decides (checkpoint.resumable) and broadcasts the decision; on a
resume every rank loads its own copy of the file and checks that it is the very checkpoint rank 0 chose (the id
each save writes into it). If any rank finds something else, every rank raises the same error together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline.runtime.errors import PipelineError
from stages.train import checkpoint
from stages.train.distributed import Distributed


class CheckpointMismatch(PipelineError):
    def __init__(self, chosen: dict[str, Any], views: list[str | None]):
        others = "; ".join(f"rank {rank} {view}" for rank, view in enumerate(views) if view is not None)
        super().__init__(
            f"rank 0 resumes {chosen['path']} at update {chosen['step']}, but {others}: every rank must see the same "
            "models/checkpoints (with several machines, a directory they all share); remove the stale "
            "last.pt or make the directory shared, then start again"
        )


def _view(state: dict[str, Any] | None, chosen: dict[str, Any]) -> str | None:
    """How this rank's copy differs from rank 0's choice; None when it is the same checkpoint."""
    if state is None:
        return "finds no readable checkpoint there"
    if state.get("save_id") != chosen["save_id"]:
        return f"finds another checkpoint there (at update {state['progress']['step']})"
    return None


def agreed_resume(dist: Distributed, path: Path, fingerprint: dict[str, Any], max_steps: int) -> dict | None:
    """The checkpoint every rank resumes from, or None when all start fresh (rank 0's decision)."""
    state = checkpoint.resumable(path, fingerprint, max_steps) if dist.is_main else None
    chosen = None if state is None else {"path": str(path), "step": state["progress"]["step"],
                                         "save_id": state.get("save_id")}
    chosen = dist.broadcast(chosen)
    if chosen is None:
        return None
    if not dist.is_main:
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)  # our own file (see checkpoint.py)
        except Exception:  # missing or unreadable: reported below, by every rank together
            state = None
    views = dist.gather(None if dist.is_main else _view(state, chosen))
    if any(view is not None for view in views):
        raise CheckpointMismatch(chosen, views)
    return state
