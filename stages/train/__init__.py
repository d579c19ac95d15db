"""train: a transformers Marian seq2seq model trained by a plain PyTorch loop (see loop.py) on the encoded arrays.

`run(params, paths)` trains in this process, or relaunches the stage through torchrun when `train.nproc` asks
for more than one process; rank 0 writes `models/final`, `metrics/train.json` and the DVCLive curves.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

from pipeline.artifacts import Paths, read_json, write_json
from pipeline.errors import MissingArtifact, PipelineError
from pipeline.params import Params

log = logging.getLogger("mtpipe.train")


def resolve_nproc(nproc: int | str) -> int:
    if nproc != "auto":
        return int(nproc)
    import torch

    return max(torch.cuda.device_count(), 1)


def run(params: Params, paths: Paths, params_file: str = "params.yaml") -> dict[str, Any]:
    if not (paths.tokenized / "meta.json").exists():
        raise MissingArtifact(paths.tokenized / "meta.json", "tokenize")
    nproc = resolve_nproc(params.train.nproc)
    if nproc > 1 and "LOCAL_RANK" not in os.environ:
        return _launch_torchrun(nproc, paths, params_file)

    from stages.train.loop import train

    metrics = train(params, paths.root)
    if int(os.environ.get("RANK", "0")) == 0:
        write_json(paths.metrics("train"), metrics)
    return metrics


def _launch_torchrun(nproc: int, paths: Paths, params_file: str) -> dict[str, Any]:
    """One process per device through torchrun; a rank that dies ends the job (torchrun stops the others)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "stages.train", params_file]
    log.info("launching %s", " ".join(cmd))
    result = subprocess.run(cmd, cwd=paths.root)
    if result.returncode != 0:
        raise PipelineError(f"distributed training failed (torchrun exit code {result.returncode})")
    return read_json(paths.metrics("train"))


def _main() -> None:
    from pipeline.stage import main

    params_file = sys.argv[1] if len(sys.argv) > 1 else "params.yaml"
    main(lambda p, paths: run(p, paths, params_file), "train", [params_file])


__all__ = ["run"]
