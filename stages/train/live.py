"""Training curves through DVCLive (rank 0 only: DVCLive is not rank-aware), and the system figures beside them.

System figures are sampled at each logging step, in the training process, so they share the curves' x axis:
CPU use and resident memory (psutil, which DVCLive depends on), and on a GPU its utilisation (NVML through the
`nvidia-ml-py` package: the share of the last sampling period, up to a second, in which a kernel ran) and the
peak memory allocated by PyTorch since the run started (a running peak, never reset), what users otherwise watch
in nvidia-smi. Without NVML the utilisation is left out and the log says so once. DVCLive's own
`monitor_system` is not used: it samples in a background thread that writes into the same `Live` object the
loop writes to (nothing synchronises the two), and its GPU "usage" divides memory-controller activity by
compute activity (see dvclive/monitor_system.py) rather than reporting utilisation.

A resumed run replays the history saved in its checkpoint before continuing, so the curves of a run that was
killed and resumed are complete and have no duplicated steps.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("mtpipe.train")


class SystemFigures:
    def __init__(self, device: Any):
        self.device = device
        self.gpu_mem_peak_gb = 0.0
        self.gpu_util_available = True
        try:
            import psutil
        except ImportError:
            self.process = None
        else:
            self.process = psutil.Process()
            self.process.cpu_percent()  # the first call only starts the measurement

    def __call__(self) -> dict[str, float]:
        import torch

        figures: dict[str, float] = {}
        if self.process is not None:
            import psutil

            # Of one core: 200 means two cores busy with this process since the previous sample.
            figures["system/cpu_percent"] = self.process.cpu_percent()
            figures["system/rss_gb"] = self.process.memory_info().rss / 2**30
            figures["system/ram_used_percent"] = psutil.virtual_memory().percent
        if self.device.type == "cuda":
            if self.gpu_util_available:
                try:
                    figures["system/gpu_util_percent"] = float(torch.cuda.utilization(self.device))
                except Exception as err:  # no NVML bindings (nvidia-ml-py), or NVML without this device
                    self.gpu_util_available = False
                    log.warning("GPU utilisation is not logged: %s (it needs nvidia-ml-py and the NVIDIA driver)",
                                err)
            # The largest of every reading: a running peak even if something else resets torch's statistics.
            self.gpu_mem_peak_gb = max(self.gpu_mem_peak_gb, torch.cuda.max_memory_allocated(self.device) / 2**30)
            figures["system/gpu_mem_peak_gb"] = self.gpu_mem_peak_gb
            figures["system/gpu_mem_reserved_gb"] = torch.cuda.memory_reserved(self.device) / 2**30
        return figures


def _live_without_git(live_class: Any, directory: Path, options: dict[str, Any]) -> Any:
    """A Live that does not look for the DVC repository (and so for Git): what DVCLive does outside one."""
    from unittest import mock

    with mock.patch("dvclive.live.get_dvc_repo", return_value=None):
        return live_class(str(directory), **options)


class Logger:
    """DVCLive on rank 0 when it is installed; plain logging always."""

    def __init__(self, directory: Path, enabled: bool):
        self.live = None
        if not enabled:
            return
        try:
            from dvclive import Live
        except ImportError:
            log.info("dvclive not installed: curves go to the log only")
            return
        # dvcyaml=None: dvc.yaml declares the plots itself; DVCLive must not rewrite it during `dvc repro`.
        # resume=False: start clean; a resumed run then replays what its checkpoint holds (steps after it were
        # never saved).
        options = dict(dvcyaml=None, save_dvc_exp=False, report=None, resume=False)
        from scmrepo.exceptions import SCMError

        try:
            self.live = Live(str(directory), **options)
        except SCMError as err:
            # DVCLive 3.x asks Git for the HEAD commit before it checks that there is one, so in a repository
            # that has none yet (`git init`, no commit: DVC itself runs there) it raises "Empty git repo"
            # (treeverse/dvclive#522). Its experiment tracking needs a commit; the curves do not, so they are
            # written without it. Any other Git error is not this one and is raised as it came.
            if "Empty git repo" not in str(err):
                raise
            log.warning("DVCLive: %s (no commit yet): curves are written without DVC experiment tracking", err)
            self.live = _live_without_git(Live, directory, options)

    def replay(self, history: list[dict[str, float]]) -> None:
        """Write the rows a checkpoint carries, the curves of the run up to it."""
        if self.live is None or not history:
            return
        for row in history:
            self._write(row)
        self.live.make_summary()

    def _write(self, row: dict[str, float]) -> None:
        assert self.live is not None
        self.live.step = int(row["step"])
        for name, value in row.items():
            if name != "step":
                self.live.log_metric(name, value)

    def log(self, row: dict[str, float]) -> None:
        if self.live is None:
            return
        self._write(row)
        self.live.make_summary()

    def close(self) -> None:
        if self.live is not None:
            self.live.end()
