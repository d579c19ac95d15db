"""train: a transformers seq2seq model trained by a plain PyTorch loop (see loop.py) on the encoded arrays: a
Marian model from scratch, or a pretrained Marian (OPUS-MT), mBART(-50) or M2M-100/NLLB checkpoint fine-tuned
(decoder inputs start from each direction's recorded start token, as the family shifts its labels).

`run(params, paths)` trains in this process, or relaunches the stage through torchrun when `train.nproc` asks
for more than one process; rank 0 writes `models/final`, `models/checkpoints`, `metrics/train.json` and the
DVCLive curves. A run that finds a matching `models/checkpoints/last.pt` (left by a run that was killed, or by a
finished run whose max_steps was raised) continues from it exactly; see checkpoint.py.

The torchrun workers get the validated params as a plain JSON spec (`python -m stages.train.loop spec.json`),
so they need neither pydantic nor yaml; the spec also carries the output length rule train-time BLEU decodes
with (the evaluate stage's default `max_len_a`/`max_len_b`, so tuning evaluate.* does not retrain).
`train.nproc` above the GPU count stops here with a clear error.
Under a torchrun started by hand (several machines, see the README), `python -m stages.train params.yaml`
trains in each worker process; `models/checkpoints` must then be on a filesystem every node sees: rank 0
decides whether to resume, and a rank that sees a different checkpoint stops the run (resume.py).

Several directions (data/tokenized/meta.json "directions", each pair's in `<split>.dir.npy`) train one model:
each epoch draws every direction's pairs by temperature sampling (`train.temperature`, sampling.py), and
validation reports loss and BLEU per direction and their mean, which best.pt, early stopping and the final model
go by (directions.py). models/final gets every file of data/tokenized/hf_tokenizer, languages.json included.

What repeats exactly: on CPUs, every run (same seed, data and threads) bit for bit, and a resumed run as the
uninterrupted one; on CUDA, up to GPU kernel non-determinism unless `train.deterministic: true` (loop.py).
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
from pipeline.errors import MissingArtifact
from pipeline.runtime.errors import PipelineError

if TYPE_CHECKING:
    from pipeline.params import Params
    from stages.train.loop import UpdateHook

log = logging.getLogger("mtpipe.train")


def resolve_nproc(nproc: int | str) -> int:
    """train.nproc as a process count: 'auto' is one per GPU (1 without); more processes than GPUs is an error
    on a GPU machine (without GPUs they share the CPU through gloo)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if nproc == "auto":
        return max(gpus, 1)
    if gpus and int(nproc) > gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise PipelineError(f"train.nproc = {nproc}, but this machine has {gpus} GPU(s)"
                            f"{f' visible (CUDA_VISIBLE_DEVICES={visible})' if visible is not None else ''}: "
                            f"set train.nproc to at most {gpus}, or to auto")
    return int(nproc)


def train_spec(params: Params, paths: Paths) -> dict[str, Any]:
    """What the loop needs, as plain JSON-able data (no pydantic objects cross into the training processes):
    the train params, the model settings, and the output length rule train-time BLEU decodes with."""
    from pipeline.params import EvaluateParams
    from stages.train.model import model_spec

    # Train-time BLEU is a training curve, not the reported score: it decodes with the schema's default length
    # rule rather than params.evaluate's, so that tuning decoding (evaluate.*) never retrains the model.
    default_length = {key: EvaluateParams.model_fields[key].default for key in ("max_len_a", "max_len_b")}
    return {
        "root": str(paths.root.resolve()),
        "role": paths.role,  # the student's artifacts lie one folder down (pipeline/artifacts.py)
        "train": params.train.model_dump(),
        "model": model_spec(params.model),
        "evaluate": default_length,
        "metrics_file": str(paths.metrics("train").resolve()),
    }


def run(params: Params, paths: Paths, params_file: str = "params.yaml",
        on_update: UpdateHook | None = None) -> dict[str, Any]:
    """Train; `params_file` is only named in the log (torchrun workers get the validated spec, not the file).
    `on_update(rank, step)` runs before each update of a run in this process (loop.train)."""
    if not (paths.tokenized / "meta.json").exists():
        raise MissingArtifact(paths.tokenized / "meta.json", "tokenize")
    nproc = resolve_nproc(params.train.nproc)
    spec = train_spec(params, paths)
    if nproc > 1 and "LOCAL_RANK" not in os.environ:
        if on_update is not None:  # a function does not cross into torchrun's worker processes
            raise ValueError("on_update needs the run in this process; train.nproc > 1 runs it under torchrun")
        return _launch_torchrun(nproc, paths, spec, params_file)

    from stages.train.loop import train

    metrics = train(spec, on_update)
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
    from pipeline.stage import STUDENT_FLAG, main

    args = sys.argv[1:]
    params_file = next((a for a in args if a != STUDENT_FLAG), "params.yaml")
    main(lambda p, paths: run(p, paths, params_file), "train", args)


__all__ = ["run"]
