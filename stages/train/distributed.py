"""The processes of one training run: rank and world from the torchrun environment, one device each, and the
few collectives the loop needs besides DDP's own gradient all-reduce. A single process when torchrun is absent.

Every collective here is entered by every rank in the same order (the loop takes its decisions on figures every
rank has, or on figures these functions make common), so no rank waits on a call another rank never makes.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as torch_dist

from pipeline.runtime.errors import PipelineError


class TooFewDevices(PipelineError):
    def __init__(self, local_rank: int, devices: int):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        super().__init__(
            f"process with LOCAL_RANK {local_rank} needs GPU {local_rank}, but {devices} GPU(s) are visible"
            f"{f' (CUDA_VISIBLE_DEVICES={visible})' if visible is not None else ''}: start at most {devices} "
            "process(es) per machine (train.nproc, or torchrun --nproc_per_node)"
        )


class Distributed:
    """Rank, world and device of this process; the process group is joined on construction."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            devices = torch.cuda.device_count()
            if self.local_rank >= devices:  # set_device would fail with "invalid device ordinal"
                raise TooFewDevices(self.local_rank, devices)
            self.device = torch.device(f"cuda:{self.local_rank}")
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if self.world > 1 and not torch_dist.is_initialized():
            torch_dist.init_process_group(backend="nccl" if self.device.type == "cuda" else "gloo")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float]) -> list[float]:
        """Sum figures over ranks (for logging, validation and the decisions every rank must share)."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch_dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, on every rank (only at checkpoints, at the resume decision and at the end)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch_dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank (what the others pass is ignored)."""
        if self.world == 1:
            return obj
        box = [obj if self.is_main else None]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            torch_dist.barrier()

    def close(self) -> None:
        if self.world > 1 and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
