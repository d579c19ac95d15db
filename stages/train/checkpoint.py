"""Checkpoints for exact resume, and the averaging of the last ones.

models/checkpoints/
  last.pt             everything a resumed run needs to continue with exactly the same updates: model, optimizer,
                      schedule, GradScaler, every rank's RNG states (python, numpy, torch, cuda) and the progress
                      (update count, epoch and position in that epoch's batch list, best valid loss, patience,
                      logged history, the running log window). Rewritten every `train.save_every` updates.
  best.pt             the same, at the validation with the lowest valid loss so far.
  average/step-N.pt   model weights only, the last `train.average_last` of them (when it is above 1).

Every file is written to a temporary name in the same directory, flushed to disk, then renamed over the old
one: a run killed at any moment leaves either the previous checkpoint or the new one, never half of one.

A checkpoint records a fingerprint of everything that shapes the training trajectory (model settings, the
optimisation params, the process count, the encoded data and, with several directions, train.temperature and
train.direction_weights, which decide each epoch's pairs). A resumed run must match it; otherwise training
starts from scratch and says why, instead of silently continuing a different configuration. Limits (max_steps,
max_epochs, max_minutes), logging, validation and checkpoint frequencies, threads and `deterministic` are not
part of it: raising max_steps continues a finished run. Each save also writes a random `save_id`, by which the
ranks of a distributed run check that they resume the very same file (resume.py). Imports only torch and numpy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stages.train.schedule import DECAYING

log = logging.getLogger("mtpipe.train")

LAST = "last.pt"
BEST = "best.pt"
AVERAGE_DIR = "average"

# The train params that change which updates are taken. The others (limits, log/valid/save frequencies,
# patience, averaging, threads) can change between a run and its resume.
TRAJECTORY_PARAMS = (
    "lr", "warmup_steps", "weight_decay", "label_smoothing", "clip_norm", "max_tokens", "update_freq", "max_len",
    "precision", "seed",
)
# With several directions, the temperature also decides which pairs each epoch trains on (sampling.py).
SAMPLING_PARAMS = ("temperature",)
# The encoded data the trainer reads; hashed whole (about a second per GB).
DATA_FILES = ("meta.json", "train.src.bin", "train.src.idx.npy", "train.tgt.bin", "train.tgt.idx.npy",
              "train.dir.npy", "valid.src.bin", "valid.src.idx.npy", "valid.tgt.bin", "valid.tgt.idx.npy",
              "valid.dir.npy", "hf_tokenizer/languages.json")


def fingerprint(spec: dict[str, Any], world: int, tokenized: Path, directions: int = 1) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: readable fields (for the log line) and their digest.
    `directions`: how many the data has (one direction is not sampled, so its temperature changes nothing)."""
    data = hashlib.sha256()
    for name in DATA_FILES:
        path = tokenized / name
        if path.exists():
            with open(path, "rb") as f:
                while chunk := f.read(1 << 24):
                    data.update(chunk)
    fields = {
        "model": spec["model"],
        "train": {k: spec["train"][k] for k in TRAJECTORY_PARAMS + (SAMPLING_PARAMS if directions > 1 else ())},
        "processes": world,
        "data": data.hexdigest()[:16],
    }
    # Frozen weights change the trajectory; recorded only when some are, so earlier checkpoints keep their digest.
    # gradient_checkpointing is left out on purpose: it gives the same updates, so a run that ran out of memory
    # may resume with it switched on.
    if spec["train"].get("freeze"):
        fields["train"]["freeze"] = sorted(spec["train"]["freeze"])
    # Direction weights decide each epoch's pairs as the temperature does; recorded only when set, for the same reason.
    if directions > 1 and spec["train"].get("direction_weights"):
        fields["train"]["direction_weights"] = spec["train"]["direction_weights"]
    # Word dropout changes every update's inputs; recorded only when set, for the same reason.
    if spec["train"].get("word_dropout"):
        fields["train"]["word_dropout"] = spec["train"]["word_dropout"]
    # A decaying schedule ends at max_steps, so max_steps shapes every update's learning rate (schedule.py);
    # recorded only then, so an inverse_sqrt run keeps its digest and can still be continued with more steps.
    if spec["train"].get("lr_schedule", "inverse_sqrt") in DECAYING:
        fields["train"]["lr_schedule"] = spec["train"]["lr_schedule"]
        fields["train"]["max_steps"] = spec["train"]["max_steps"]
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return {"digest": digest, "fields": fields}


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {a!r} -> {b!r}")
    return out


def resumable(path: Path, expected: dict[str, Any], max_steps: int) -> dict[str, Any] | None:
    """The checkpoint at `path` when training may continue from it; None (and the reason, logged) otherwise."""
    if not path.exists():
        return None
    try:
        # Our own file: it holds numpy RNG states and plain Python objects, not only tensors.
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # a corrupt file must not stop training: it can only be a fresh start
        log.warning("%s is unreadable (%s): starting fresh", path, err)
        return None
    saved = state.get("fingerprint", {})
    if saved.get("digest") != expected["digest"]:
        changed = _differences(saved.get("fields", {}), expected["fields"])
        log.warning("%s was written for a different configuration (%s): starting fresh", path,
                    "; ".join(changed) or "unknown format")
        return None
    if state["progress"]["step"] > max_steps:
        log.warning("%s is at update %d, beyond train.max_steps %d: starting fresh", path,
                    state["progress"]["step"], max_steps)
        return None
    return state


def clear(directory: Path) -> None:
    """Remove the checkpoints of an earlier, different run (a fresh start must not average or resume them)."""
    for name in (LAST, BEST):
        (directory / name).unlink(missing_ok=True)
    shutil.rmtree(directory / AVERAGE_DIR, ignore_errors=True)


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to a temporary sibling, fsync, rename: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def link_atomic(src: Path, dst: Path) -> None:
    """dst becomes another name of src's current content (a hard link, no copy); atomic like save_atomic."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:  # a filesystem without hard links
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def save_average_snapshot(weights: dict[str, Any], directory: Path, step: int, keep: int) -> None:
    """Model weights of this update for the final average; only the last `keep` are kept."""
    folder = directory / AVERAGE_DIR
    save_atomic(weights, folder / f"step-{step:09d}.pt")
    for old in sorted(folder.glob("step-*.pt"))[:-keep]:
        old.unlink()


def snapshot_step(file: Path) -> int:
    """The update a weight snapshot was taken at, from its name (step-000004100.pt)."""
    return int(file.stem.split("-")[1])


def snapshot_files(directory: Path, until: int | None = None) -> list[Path]:
    """The weight snapshots in update order; with `until`, those taken at or before that update."""
    files = sorted((directory / AVERAGE_DIR).glob("step-*.pt"))
    return [f for f in files if until is None or snapshot_step(f) <= until]


def average_snapshots(directory: Path, last: int, until: int | None = None) -> tuple[dict[str, Any], list[int]]:
    """The element-wise mean of the last `last` weight snapshots (in float64, cast back), and their steps; with
    `until`, the last of those taken at or before that update."""
    files = snapshot_files(directory, until)[-last:]
    if not files:
        raise FileNotFoundError(f"no checkpoints to average in {directory / AVERAGE_DIR}")
    total: dict[str, Any] = {}
    for f in files:
        weights = torch.load(f, map_location="cpu", weights_only=True)
        for name, tensor in weights.items():
            if name in total:
                total[name] += tensor.to(torch.float64)
            else:
                total[name] = tensor.to(torch.float64)
    dtypes = torch.load(files[-1], map_location="cpu", weights_only=True)
    averaged = {name: (t / len(files)).to(dtypes[name].dtype) for name, t in total.items()}
    return averaged, [snapshot_step(f) for f in files]


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random states; dropout masks come from torch's, the others are saved for completeness."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
