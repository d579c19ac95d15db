"""The process-wide torch settings a training run needs, set for the run and put back afterwards.

- Threads: `train.threads` intra-op threads (default: the cores shared out among the processes of the run; the
  cores the process may run on, usable_cores, which a taskset, a cgroup cpuset or `docker run --cpuset-cpus`
  narrows while os.cpu_count() still counts the whole machine).
- TF32 on CUDA: fp32 matmuls and convolutions run on the tensor cores in TF32 (10-bit mantissa inputs, fp32
  accumulation), what `precision: fp32` means on a GPU; several times the throughput of true fp32 matmuls on
  A100/H100/H200. Under bf16/fp16 autocast the matmuls are in bf16/fp16 anyway. CPUs are unaffected.
- `train.deterministic`: torch.use_deterministic_algorithms(True). PyTorch then picks deterministic kernels
  where it has them and raises (naming the op) where it has none; on CUDA it also needs
  CUBLAS_WORKSPACE_CONFIG, set here when the environment leaves it unset. Slower on GPUs.

These are process-wide switches (torch has no other kind): a run sets them on entry and restores the previous
values on exit, so a run inside a larger process (tests, benchmarks) leaves no trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"  # the value PyTorch's reproducibility notes give for cuBLAS


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one), as torch sizes its own
    thread pool: more threads than that would take turns on the same cores."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


@contextmanager
def kernel_settings(device: torch.device, threads: int, deterministic: bool) -> Iterator[None]:
    saved_threads = torch.get_num_threads()
    saved_matmul = torch.get_float32_matmul_precision()
    saved_cudnn_tf32 = torch.backends.cudnn.allow_tf32
    saved_deterministic = (torch.are_deterministic_algorithms_enabled(),
                           torch.is_deterministic_algorithms_warn_only_enabled())
    saved_cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls
        torch.backends.cudnn.allow_tf32 = True
    sets_cublas = deterministic and device.type == "cuda" and saved_cublas is None
    if sets_cublas:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC_WORKSPACE
    if deterministic:
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved_deterministic[0], warn_only=saved_deterministic[1])
        if sets_cublas:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        torch.backends.cudnn.allow_tf32 = saved_cudnn_tf32
        torch.set_float32_matmul_precision(saved_matmul)
        torch.set_num_threads(saved_threads)
