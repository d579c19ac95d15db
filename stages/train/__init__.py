"""train: a transformers Marian seq2seq model trained by a plain PyTorch loop (see loop.py) on the encoded arrays.

`run(params, paths)` trains in this process, or relaunches the stage through torchrun when `train.nproc` asks
for more than one process; rank 0 writes `models/final`, `models/checkpoints`, `metrics/train.json` and the
DVCLive curves. A run that finds a matching `models/checkpoints/last.pt` (left by a run that was killed, or by a
finished run whose max_steps was raised) continues from it exactly; see checkpoint.py.

The torchrun workers get the validated params as a plain JSON spec (`python -m stages.train.loop spec.json`),
so they need neither pydantic nor yaml. Under a torchrun started by hand (several machines, see the README),
`python -m stages.train params.yaml` trains in each worker process; `models/checkpoints` must then be on a
filesystem every node sees for a resume to find it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from pipeline.artifacts import Paths, read_json, write_json
from pipeline.errors import MissingArtifact, PipelineError

if TYPE_CHECKING:
    from pipeline.params import Params

log = logging.getLogger("mtpipe.train")


def resolve_nproc(nproc: int | str) -> int:
    if nproc != "auto":
        return int(nproc)
    import torch

    return max(torch.cuda.device_count(), 1)


def train_spec(params: Params, paths: Paths) -> dict[str, Any]:
    """What the loop needs, as plain JSON-able data (no pydantic objects cross into the training processes)."""
    from stages.train.model import model_spec

    return {
        "root": str(paths.root.resolve()),
        "train": params.train.model_dump(),
        "model": model_spec(params.model),
        "metrics_file": str(paths.metrics("train").resolve()),
    }


def run(params: Params, paths: Paths, params_file: str = "params.yaml") -> dict[str, Any]:
    """Train; `params_file` is only named in the log (torchrun workers get the validated spec, not the file)."""
    if not (paths.tokenized / "meta.json").exists():
        raise MissingArtifact(paths.tokenized / "meta.json", "tokenize")
    spec = train_spec(params, paths)
    nproc = resolve_nproc(params.train.nproc)
    if nproc > 1 and "LOCAL_RANK" not in os.environ:
        return _launch_torchrun(nproc, paths, spec, params_file)

    from stages.train.loop import train

    metrics = train(spec)
    if int(os.environ.get("RANK", "0")) == 0:
        write_json(paths.metrics("train"), metrics)
    return metrics


def _launch_torchrun(nproc: int, paths: Paths, spec: dict[str, Any], params_file: str) -> dict[str, Any]:
    """One process per device through torchrun; a rank that dies ends the job (torchrun stops the others)."""
    paths.metrics("train").unlink(missing_ok=True)  # the workers' rank 0 writes it; a stale one must not be read
    with tempfile.TemporaryDirectory(prefix="mtpipe-train-") as tmp:
        spec_file = os.path.join(tmp, "spec.json")
        with open(spec_file, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "stages.train.loop", spec_file]
        log.info("launching %s (params from %s)", " ".join(cmd), params_file)
        result = subprocess.run(cmd, cwd=paths.root)
    if result.returncode != 0:
        raise PipelineError(f"distributed training failed (torchrun exit code {result.returncode}; the failing "
                            "rank's error is above)")
    return read_json(paths.metrics("train"))


def _main() -> None:
    from pipeline.stage import main

    params_file = sys.argv[1] if len(sys.argv) > 1 else "params.yaml"
    main(lambda p, paths: run(p, paths, params_file), "train", [params_file])


__all__ = ["run"]
