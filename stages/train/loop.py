"""The training engine: `train(spec)` = setup -> restore -> fit -> finish, over an explicit `TrainState`.

Run in the stage's own process, or by torchrun with one process per device: the stage relaunches itself as
`torchrun ... -m stages.train.loop spec.json` when `train.nproc` > 1. The spec is plain JSON, so this module and its
workers import only torch, transformers, numpy and, when installed, dvclive (with psutil), sacrebleu and
nvidia-ml-py: the engine runs on a GPU machine that has nothing else of this project's dependencies
(bench/gpu_check.sh runs it there). The data, model, objective, batches, prefetching, checkpoints, resume decision
and torch settings are their own modules' (data.py, sampling.py, model.py, loss.py, batching.py, prefetch.py,
checkpoint.py, resume.py, kernels.py); determinism is README.md's "Train on GPUs". What this file decides:

- An update consumes `world x update_freq` batches, and its gradient is that of their summed token losses divided by
  their real target tokens, so 2 processes x 1 micro-batch and 1 process x 2 micro-batches take the same update (up
  to float rounding; dropout masks differ).
- Nothing waits for the device in the middle of an update. The optimizer step of an update with a non-finite
  gradient is skipped on the device (fused AdamW takes the flag, as it does from GradScaler); the host reads the
  update's gradient norm one update later, after the next update's forward and backward are queued, and only then
  books it (step count, schedule, skipped updates). Updates after which something happens (a log line, validation,
  a checkpoint, the end of an epoch, the last update) are booked at once, so every such event sees the state right
  after its update, as if nothing were lagged.
- A run started while a matching models/checkpoints/last.pt exists continues from it and takes the updates the
  uninterrupted run would have taken.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from pipeline.artifacts import Paths, write_json
from pipeline.runtime.errors import PipelineError
from stages.train import checkpoint
from stages.train.batching import PlannedUpdate, planned_updates
from stages.train.bleu import ValidBleu
from stages.train.data import RunData, load_data
from stages.train.directions import best_figures, mean, per_direction_text, validation_row
from stages.train.distributed import Distributed
from stages.train.dropout import training_dropout
from stages.train.kernels import kernel_settings, usable_cores
from stages.train.live import Logger, SystemFigures
from stages.train.loss import TokenLoss
from stages.train.model import (
    build_model,
    count_parameters,
    enable_gradient_checkpointing,
    freeze,
    training_attention,
    zero_rows,
    zero_start_rows,
)
from stages.train.precision import resolve_precision
from stages.train.prefetch import Prefetcher, ReadyUpdate
from stages.train.resume import agreed_resume
from stages.train.save import save_final
from stages.train.schedule import lr_factor
from stages.train.state import TrainState
from stages.train.word_dropout import WordDropout

log = logging.getLogger("mtpipe.train")
LN2 = math.log(2)
PREFETCH_UPDATES = 2  # updates built ahead by the batch thread (0: built in the loop's thread, for comparisons)
# Where a caller hooks each update: called with (rank, the number of the update about to be taken) before it runs.
UpdateHook = Callable[[int, int], None]


class TrainingDiverged(PipelineError):
    def __init__(self, step: int, in_a_row: int, precision: str):
        hint = ", or train in bf16 instead of fp16" if precision == "fp16" else ""
        super().__init__(
            f"training diverged: {in_a_row} updates in a row after update {step} had a non-finite loss or gradient "
            f"(train.max_bad_steps = {in_a_row}); lower train.lr or raise train.warmup_steps{hint}"
        )


def seq2seq_loss(objective: torch.nn.Module, inputs: dict[str, torch.Tensor], label_smoothing: float,
                 grad_scale: float = 1.0) -> torch.Tensor:
    """Summed label-smoothed cross entropy over the real target tokens, through `objective` (a loss.TokenLoss, or
    DDP around one)."""
    return objective(**inputs, label_smoothing=label_smoothing, grad_scale=grad_scale)


def parameter_digest(model: torch.nn.Module) -> str:
    """A hash of every parameter's bytes: DDP replicas must end bit-identical."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def on_device(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Host tensors to the device; asynchronous when they are pinned (a no-op on the CPU)."""
    return {name: t.to(device, non_blocking=True) for name, t in tensors.items()}


@dataclass
class Run:
    """What stays fixed for the whole run: its settings, processes, data, model, optimisation and outputs."""

    train_params: SimpleNamespace  # spec["train"]: the validated `train:` params, `precision` resolved
    spec: dict[str, Any]
    precision_reason: str  # why the run trains in train_params.precision (precision.py)
    paths: Paths  # rooted at spec["root"]
    dist: Distributed
    threads: int
    data: RunData
    model: torch.nn.Module  # the bare model: validation, decoding, checkpoints and the final save use it
    objective: torch.nn.Module  # the training forward: loss.TokenLoss around the model (DDP-wrapped with several ranks)
    amp_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    pad_rows: list[torch.Tensor]
    word_dropout: WordDropout  # the training forward's input noise (train.word_dropout)
    fingerprint: dict[str, Any]
    logger: Logger
    system: SystemFigures
    bleu: ValidBleu

    @property
    def device(self) -> torch.device:
        return self.dist.device

    def updates_in_epoch(self, epoch: int) -> int:
        return self.data.epochs.updates(epoch, self.dist.world * self.train_params.update_freq)

    def autocast(self) -> Any:
        """AMP, chosen once: bf16 needs no loss scaling; fp16 does (GradScaler); fp32 runs without autocast."""
        return torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype is not None else nullcontext()

    def dropout(self) -> Any:
        """The training forward's dropout: the faster uniform masks on CPUs (dropout.py), PyTorch's elsewhere."""
        return training_dropout(self.device)


def _zero_a_trained_start_row(pad_rows: list[torch.Tensor], model_spec: dict[str, Any], is_main: bool) -> None:
    """Zero a pretrained Marian checkpoint's <pad> rows where they are not zero (one fine-tuned elsewhere with the
    row trained): CTranslate2 cannot run such a model as trained, so it is made one it can, before the first
    update, and fine-tuning adapts to the zero start; the checkpoint's own outputs change, hence the warning."""
    norm = zero_rows(pad_rows)
    if norm > 0 and is_main:
        log.warning("%s: the <pad> embedding row Marian decodes from is not zero (norm %.3g), as it is in OPUS-MT "
                    "checkpoints and as CTranslate2 assumes; zeroed before training, which changes the checkpoint's "
                    "outputs until fine-tuning adapts to it", model_spec.get("name_or_path") or "the model", norm)


def _trainable_model(model_spec: dict[str, Any], meta: dict[str, Any], family: Any, train_params: SimpleNamespace,
                     device: torch.device) -> torch.nn.Module:
    """The model built (or loaded) with the seed, frozen parts fixed, and training's attention, on the device."""
    model = build_model(model_spec, meta["vocab_size"], meta["pad_id"], meta["eos_id"], seed=train_params.seed,
                        joint_vocab=meta.get("joint", True), family=family)
    # Frozen weights take no gradient, so AdamW leaves them as they are (model.py says what each part holds).
    freeze(model, train_params.freeze)
    if train_params.gradient_checkpointing:
        # The recomputation runs inside backward, outside the forward's dropout block: it gets the same block.
        enable_gradient_checkpointing(model, lambda: training_dropout(device))
    training_attention(model, device)
    return model.to(device)


def _optimizer(model: torch.nn.Module, train_params: SimpleNamespace) -> torch.optim.AdamW:
    """AdamW whose weight decay reaches the matrices (projections, embeddings) and not biases or LayerNorm gains:
    decaying those pulls the normalisation towards zero, which no regularisation asks for."""
    params = list(model.parameters())
    # Without decay one group, as before the split: a run's checkpointed optimizer state then loads as it was saved.
    groups = ([{"params": params, "weight_decay": 0.0}] if not train_params.weight_decay else
              [{"params": [p for p in params if p.ndim >= 2], "weight_decay": train_params.weight_decay},
               {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}])
    # Fused AdamW: one kernel per parameter group and step, on CPUs as on GPUs; it also takes the on-device
    # "skip this step" flag (apply_update), which the unfused implementations do not.
    return torch.optim.AdamW(groups, lr=train_params.lr, betas=(0.9, 0.98), eps=1e-9, fused=True)


def setup(spec: dict[str, Any], dist: Distributed, threads: int) -> Run:
    """Data, model, DDP, AMP, optimizer and schedule, before any resume (the initial weights: seed alone)."""
    # `auto` is resolved once, here, so the fingerprint, the autocast and the metrics all see the same precision.
    precision, precision_reason = resolve_precision(spec["train"]["precision"], dist.device)
    spec = {**spec, "train": {**spec["train"], "precision": precision}}
    train_params = SimpleNamespace(**spec["train"])
    paths = Paths(Path(spec["root"]), spec.get("role", ""))
    # Dropout: each rank draws its own masks, as it has its own data (build_model does not touch this stream).
    torch.manual_seed(train_params.seed + dist.rank)

    # ---- data: pre-encoded arrays and each pair's direction; the batches of each epoch (data.py) ----
    data = load_data(paths.tokenized, train_params)
    meta = data.meta
    n_batches, per_update = len(data.epochs(1)[0]), dist.world * train_params.update_freq
    if n_batches < per_update:
        raise PipelineError(f"{n_batches} batches cannot feed one update of {dist.world} process(es) x "
                            f"update_freq {train_params.update_freq}; lower train.max_tokens or train.update_freq")

    # ---- model, DDP, AMP, optimizer, schedule ----
    model = _trainable_model(spec["model"], meta, data.languages.family, train_params, dist.device)
    # DDP wraps the objective for the training forward (its hooks all-reduce gradients in backward());
    # validation, decoding and saving use the bare model.
    objective = DDP(TokenLoss(model)) if dist.world > 1 else TokenLoss(model)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[train_params.precision]
    scaler = torch.amp.GradScaler(dist.device.type, enabled=train_params.precision == "fp16")
    optimizer = _optimizer(model, train_params)
    shape, warmup, max_steps = train_params.lr_schedule, train_params.warmup_steps, train_params.max_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(shape, s + 1, warmup, max_steps))
    # Marian's <pad> rows stay at zero, built or pretrained (model.zero_start_rows: Marian decodes from them,
    # CTranslate2 from a zero vector). Taken after model.to(): the rows are views of the weights on the device.
    pad_rows = zero_start_rows(model, meta["pad_id"])
    _zero_a_trained_start_row(pad_rows, spec["model"], dist.is_main)
    bleu_sentences = train_params.valid_bleu_sentences if dist.is_main else 0
    return Run(
        train_params=train_params, spec=spec, precision_reason=precision_reason, paths=paths, dist=dist,
        threads=threads, data=data,
        model=model, objective=objective, amp_dtype=amp_dtype, scaler=scaler, optimizer=optimizer,
        schedule=schedule, pad_rows=pad_rows,
        word_dropout=WordDropout(train_params.word_dropout, meta.get("unk_id"),
                                 [meta["pad_id"], meta["eos_id"], *data.languages.special_ids], dist.device),
        fingerprint=checkpoint.fingerprint(spec, dist.world, paths.tokenized, len(data.directions)),
        logger=Logger(paths.dvclive, dist.is_main),
        system=SystemFigures(dist.device),
        bleu=ValidBleu(data.valid, data.valid_rows, paths.tokenizer, bleu_sentences, train_params.seed,
                       train_params.max_tokens, spec["evaluate"]["max_len_a"], spec["evaluate"]["max_len_b"]),
    )


def restore(run: Run) -> TrainState:
    """The state to start from: a matching last.pt (every rank resumes it, or none does), else a fresh start."""
    last = run.paths.checkpoints / checkpoint.LAST
    saved = agreed_resume(run.dist, last, run.fingerprint, run.train_params.max_steps)
    if saved is None:
        if run.dist.is_main:
            checkpoint.clear(run.paths.checkpoints)
        return TrainState.start(run.device)
    run.model.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    run.schedule.load_state_dict(saved["schedule"])
    run.scaler.load_state_dict(saved["scaler"])
    checkpoint.set_rng_state(saved["rng"][run.dist.rank], run.device)
    state = TrainState.start(run.device, saved["progress"])
    run.logger.replay(state.history)
    if run.dist.is_main:
        log.info("resuming from %s at update %d (epoch %d, update %d of the epoch)", last, state.step, state.epoch,
                 state.update_in_epoch)
    return state


# ---------------------------------------------------------------------------------------------------------------
# One update: forward and backward over its micro-batches, then the optimizer step, queued without waiting.


def forward_backward(run: Run, update: ReadyUpdate) -> torch.Tensor:
    """Accumulate the update's gradient over its micro-batches; returns its summed loss (float64, on the device)."""
    # DDP averages gradients over ranks; times world / (the update's target tokens) makes the result the gradient
    # of the update's summed token loss per target token.
    scale = run.dist.world / float(update.plan.target_tokens)
    update_loss = torch.zeros((), dtype=torch.float64, device=run.device)
    for m, host_inputs in enumerate(update.inputs):
        inputs = run.word_dropout(on_device(host_inputs, run.device))
        # DDP all-reduces gradients inside backward(). no_sync() lets all but the last micro-batch only
        # accumulate locally, so an update costs one all-reduce whatever update_freq is.
        last_micro = m == len(update.inputs) - 1
        with run.objective.no_sync() if run.dist.world > 1 and not last_micro else nullcontext():
            with run.autocast(), run.dropout():
                loss_sum = seq2seq_loss(run.objective, inputs, run.train_params.label_smoothing, scale)
            run.scaler.scale(loss_sum * scale).backward()
        update_loss += loss_sum.detach()
    return update_loss


class PendingUpdate:
    """An update queued on the device; its gradient norm (which decided whether it stepped) is read later."""

    def __init__(self, update: ReadyUpdate, loss_sum: torch.Tensor, grad_norm: torch.Tensor):
        self.plan: PlannedUpdate = update.plan
        self.tokens = (update.tgt_tokens, update.src_tokens, update.padded_tokens)
        self.loss_sum = loss_sum
        if grad_norm.device.type == "cuda":
            self._norm = torch.empty((), dtype=grad_norm.dtype, pin_memory=True)
            self._norm.copy_(grad_norm.detach(), non_blocking=True)
            self._done: torch.cuda.Event | None = torch.cuda.Event()
            self._done.record()  # after the whole update: waiting on it waits for nothing queued later
        else:
            self._norm, self._done = grad_norm.detach(), None

    def grad_norm(self) -> float:
        """Waits until the device has finished this update (not the ones queued after it)."""
        if self._done is not None:
            self._done.synchronize()
        return float(self._norm.item())


def apply_update(run: Run, update: ReadyUpdate, loss_sum: torch.Tensor) -> PendingUpdate:
    """Clip, then step unless the gradient is non-finite: decided on the device, so the host does not wait.

    Every rank holds the same all-reduced gradients, hence the same norm and the same decision (a rank that
    stepped alone would leave the replicas out of step)."""
    run.scaler.unscale_(run.optimizer)  # clip and check the true gradient, not the fp16-scaled one
    clip = run.train_params.clip_norm if run.train_params.clip_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), clip)
    # Fused AdamW skips the step (parameters, moments and step count) when found_inf is 1: the attribute is how
    # GradScaler hands it over (torch/amp/grad_scaler.py), set here for every precision.
    run.optimizer.found_inf = (~torch.isfinite(grad_norm)).to(torch.float32)
    try:
        run.optimizer.step()
    finally:
        del run.optimizer.found_inf
    with torch.no_grad():
        for row in run.pad_rows:  # a skipped step left them at zero already
            row.zero_()
    run.scaler.update()  # fp16: lower the loss scale after an overflow, raise it after a long run without
    run.optimizer.zero_grad(set_to_none=True)
    return PendingUpdate(update, loss_sum, grad_norm)


# ---------------------------------------------------------------------------------------------------------------
# The loop and what happens between updates.


def eventful(state: TrainState, run: Run, pending: PendingUpdate) -> bool:
    """Whether something happens after this update if it steps: those updates are booked at once."""
    p, step = run.train_params, state.step + 1
    return (step % p.log_every == 0 or step % p.valid_every == 0 or step % p.save_every == 0
            or step >= p.max_steps or pending.plan.ends_epoch)


def fit(state: TrainState, run: Run, on_update: UpdateHook | None = None) -> str:
    """Take updates until a limit is reached; returns which (see the module docstring for the lagged booking).
    `on_update` is called before each update, with this rank and the update's number."""
    if state.update_in_epoch >= run.updates_in_epoch(state.epoch):  # a checkpoint written at the end of an epoch
        state.epoch, state.update_in_epoch = state.epoch + 1, 0
    stop = limit_reached(state, run)
    max_minutes = run.train_params.max_minutes
    if max_minutes is not None and state.train_seconds >= max_minutes * 60:
        stop = stop or "max_minutes"  # a resumed run may have nothing left to do (the same on every rank)
    plan = planned_updates(run.data.epochs, run.train_params.seed, run.dist.rank, run.dist.world,
                           run.train_params.update_freq, state.epoch, state.update_in_epoch)
    feed = Prefetcher(plan, run.data.train, run.device, PREFETCH_UPDATES)
    pending: PendingUpdate | None = None
    run.objective.train()
    state.window_mark = time.perf_counter()
    try:
        while not stop:
            update = next(feed)
            if on_update is not None:  # the pending update, not booked yet, comes before this one
                on_update(run.dist.rank, state.step + (pending is not None) + 1)
            loss_sum = forward_backward(run, update)
            if pending is not None:  # the previous update, booked while this one is queued on the device
                book(state, run, pending)
            pending = apply_update(run, update, loss_sum)
            if eventful(state, run, pending):
                stop = book(state, run, pending)
                pending = None
    finally:
        feed.close()
    return stop


def book(state: TrainState, run: Run, pending: PendingUpdate) -> str:
    """Count a finished update (stepped or skipped) and run what follows it; returns a stop reason or ''."""
    grad_norm = pending.grad_norm()  # waits for the device to finish this update
    now = time.perf_counter()
    state.window.seconds += now - state.window_mark
    state.epoch, state.update_in_epoch = pending.plan.epoch, pending.plan.index + 1
    state.last_grad_norm = grad_norm
    stop = ""
    if math.isfinite(grad_norm):
        state.step += 1
        state.bad_in_a_row = 0
        run.schedule.step()
        state.window_loss += pending.loss_sum
        state.window.updates += 1
        tgt, src, padded = pending.tokens
        state.window.tgt, state.window.src, state.window.padded = (
            state.window.tgt + tgt, state.window.src + src, state.window.padded + padded)
        stop = after_update(state, run)
    else:
        state.skipped_updates += 1
        state.bad_in_a_row += 1
        if run.dist.is_main:
            log.warning("non-finite loss or gradient after update %d: update skipped (%d in a row, %d in all)",
                        state.step, state.bad_in_a_row, state.skipped_updates)
        if state.bad_in_a_row >= run.train_params.max_bad_steps:
            raise TrainingDiverged(state.step, state.bad_in_a_row, run.train_params.precision)
    if pending.plan.ends_epoch:
        state.epoch, state.update_in_epoch = state.epoch + 1, 0
        stop = stop or limit_reached(state, run)
    state.window_mark = time.perf_counter()  # what happened after the update is not training time
    return stop


def after_update(state: TrainState, run: Run) -> str:
    """Log, validate and save at their frequencies; returns a stop reason or ''."""
    p, step = run.train_params, state.step
    stop = limit_reached(state, run)
    if step % p.log_every == 0 and log_window(state, run) and not stop:
        stop = "max_minutes"
    to_save = []
    if step % p.valid_every == 0 and validate(state, run):
        to_save.append(checkpoint.BEST)
    if step % p.save_every == 0:
        to_save.append(checkpoint.LAST)
    if to_save:
        save(state, run, to_save)
    return stop or limit_reached(state, run)


def limit_reached(state: TrainState, run: Run) -> str:
    """The limits every rank sees alike (the time limit is decided at log steps, over all ranks)."""
    p = run.train_params
    if state.step >= p.max_steps:
        return "max_steps"
    if p.max_epochs is not None and state.epoch > p.max_epochs:
        return "max_epochs"
    if p.patience is not None and state.stale_validations >= p.patience:
        return "early_stopping"
    return ""


def record(state: TrainState, run: Run, row: dict[str, float]) -> None:
    state.history.append(row)
    run.logger.log(row)


def log_window(state: TrainState, run: Run) -> bool:
    """Log the figures since the last log line; True when the time limit is reached (a shared decision)."""
    window, max_minutes = state.window, run.train_params.max_minutes
    over_time = float(max_minutes is not None and state.seconds() >= max_minutes * 60)
    loss_total, tgt, src, padded, over_time = run.dist.sum(
        [state.window_loss.item(), window.tgt, window.src, window.padded, over_time])
    if run.dist.is_main:
        row = {
            "step": state.step,
            "train/loss": loss_total / max(tgt, 1) / LN2,
            "train/lr": run.schedule.get_last_lr()[0],
            "train/tgt_tokens_per_s": tgt / max(window.seconds, 1e-9),
            "train/padding_efficiency": (src + tgt) / max(padded, 1),
            "train/grad_norm": state.last_grad_norm,
            "train/skipped_updates": state.skipped_updates,
            **run.system(),
        }
        record(state, run, row)
        log.info("step %d epoch %d loss %.3f lr %.2e %.0f tgt tok/s pad-eff %.2f", state.step, state.epoch,
                 row["train/loss"], row["train/lr"], row["train/tgt_tokens_per_s"], row["train/padding_efficiency"])
    window.tgt, window.src, window.padded, window.seconds, window.updates = 0, 0, 0, 0.0, 0
    state.window_loss.zero_()
    return over_time > 0


def valid_loss_sums(run: Run, batch_list: list[tuple[int, np.ndarray]]) -> list[float]:
    """Per direction, the summed valid loss and target tokens over `batch_list` ([loss_0, tokens_0, loss_1, ...];
    no label smoothing, no dropout)."""
    valid_objective = TokenLoss(run.model).eval()  # eval() reaches the model: no dropout
    directions = len(run.data.directions)
    totals = [torch.zeros((), dtype=torch.float64, device=run.device) for _ in range(directions)]
    tokens = [0] * directions
    with torch.no_grad(), run.autocast():
        for d, idx in batch_list:
            batch = run.data.valid(idx)
            inputs = on_device({k: torch.from_numpy(a) for k, a in batch.arrays().items()}, run.device)
            totals[d] += seq2seq_loss(valid_objective, inputs, 0.0)
            tokens[d] += batch.tgt_tokens
    run.model.train()
    return [x for d in range(directions) for x in (totals[d].item(), float(tokens[d]))]


def direction_losses(sums: list[float]) -> list[float]:
    """Bits per target token of each direction, from valid_loss_sums' (summed over ranks) figures."""
    return [loss / max(tokens, 1) / LN2 for loss, tokens in zip(sums[::2], sums[1::2], strict=True)]


def validate(state: TrainState, run: Run) -> bool:
    """Valid loss (bits/token, sharded over ranks) and, on rank 0, BLEU, per direction; their means decide: True
    when the mean loss is the best yet."""
    dist = run.dist
    losses = direction_losses(dist.sum(valid_loss_sums(run, run.data.valid_batches[dist.rank :: dist.world])))
    bleus = run.bleu(run.model, run.device, run.autocast) if run.bleu.enabled else None
    row = {"step": state.step, **validation_row(run.data.directions, losses, bleus)}
    improved = row["valid/loss"] < state.best_valid_loss  # a NaN loss never improves
    if improved:
        state.best_valid_loss, state.best_step, state.stale_validations = row["valid/loss"], state.step, 0
        state.best_valid_bleu = row.get("valid/bleu")
    else:
        state.stale_validations += 1
    state.last_validated = state.step
    if dist.is_main:
        record(state, run, row)
        log.info("step %d valid loss %.3f bits/token%s%s%s", state.step, row["valid/loss"],
                 f" BLEU {row['valid/bleu']:.2f}" if "valid/bleu" in row else "", " (best)" if improved else "",
                 per_direction_text(row, run.data.directions))
    return improved


def save(state: TrainState, run: Run, names: list[str]) -> None:
    """Write the full training state under the first name, hard-link the others (rank 0 writes)."""
    rngs = run.dist.gather(checkpoint.rng_state(run.device))  # every rank's dropout RNG, for an exact resume
    state.train_seconds = state.seconds()
    if checkpoint.LAST in names:
        state.last_saved = state.step
    if not run.dist.is_main:
        return
    blob = {
        "fingerprint": run.fingerprint,
        "save_id": uuid.uuid4().hex,  # which checkpoint this is: every rank checks it resumes the same one
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "schedule": run.schedule.state_dict(),
        "scaler": run.scaler.state_dict(),
        "rng": rngs,
        "progress": state.progress(),
    }
    checkpoint.save_atomic(blob, run.paths.checkpoints / names[0])
    for name in names[1:]:
        checkpoint.link_atomic(run.paths.checkpoints / names[0], run.paths.checkpoints / name)
    if checkpoint.LAST in names and run.train_params.average_last > 1:
        weights = {k: v.detach().to("cpu", copy=True) for k, v in run.model.state_dict().items()}
        checkpoint.save_average_snapshot(weights, run.paths.checkpoints, state.step, run.train_params.average_last)


# ---------------------------------------------------------------------------------------------------------------
# The end: last figures, validation and checkpoint at the final update, then models/final and the metrics.


def finish(state: TrainState, run: Run, stop_reason: str) -> dict[str, Any]:
    """Close the run on every rank; rank 0 writes models/final and returns the metrics (others return {})."""
    if state.window.updates:
        log_window(state, run)
    to_save = []
    if state.last_validated != state.step and validate(state, run):
        to_save.append(checkpoint.BEST)
    if state.last_saved != state.step:
        to_save.append(checkpoint.LAST)
    if to_save:
        save(state, run, to_save)
    digests = run.dist.gather(parameter_digest(run.model))
    if len(set(digests)) != 1:  # checked before anything is written from them
        raise PipelineError(f"the {run.dist.world} DDP replicas ended with different parameters: {digests}")
    if not run.dist.is_main:
        return {}
    final_model, final_valid_loss = load_final_weights(state, run)
    metrics = run_metrics(state, run, stop_reason, final_model, final_valid_loss)
    metrics["replica_digests"] = sorted(set(digests))  # one: every rank ended with the same parameters
    save_final(run.model.cpu(), run.paths.tokenizer, run.paths.final_model)
    log.info("saved models/final (%s)", final_model)
    run.logger.close()
    return metrics


def load_final_weights(state: TrainState, run: Run) -> tuple[str, float]:
    """Put the final weights into run.model: the average of the last checkpoints, the best ones, or (when no
    validation ever gave a finite loss, so best.pt was never written) the last ones. Returns what they are and
    their valid loss."""
    ckpt = run.paths.checkpoints
    final_valid_loss = state.best_valid_loss
    if run.train_params.average_last > 1:
        weights, steps = checkpoint.average_snapshots(ckpt, run.train_params.average_last)
        final_model = f"average of the checkpoints at updates {', '.join(map(str, steps))}"
    elif (ckpt / checkpoint.BEST).exists():
        # Our own file; mmap: only the model's tensors are read, not the optimizer state.
        weights = torch.load(ckpt / checkpoint.BEST, map_location="cpu", weights_only=False, mmap=True)["model"]
        final_model = f"best valid loss, update {state.best_step}"
    else:
        weights = None
        final_model = f"last update, {state.step} (no validation had a finite loss, so there is no best.pt)"
        log.warning("no validation had a finite valid loss: models/final holds the weights of the last update")
    if weights is not None:
        run.model.load_state_dict(weights)
    with torch.no_grad():
        for row in run.pad_rows:  # an average of zero rows is zero already; zeroed here so it visibly stays so
            row.zero_()
    if weights is None or run.train_params.average_last > 1:
        final_valid_loss = mean(direction_losses(valid_loss_sums(run, run.data.valid_batches)))
    return final_model, final_valid_loss


def _rounded(value: float | None, digits: int) -> float | None:
    """JSON has no inf or NaN: a figure that is not finite is written as null."""
    return round(value, digits) if value is not None and math.isfinite(value) else None


def run_metrics(state: TrainState, run: Run, stop_reason: str, final_model: str,
                final_valid_loss: float) -> dict[str, Any]:
    """metrics/train.json; the valid figures are means over directions, and with several directions
    "directions" gives each one's figures at the best validation and its pairs in an epoch."""
    p = run.train_params
    train_rows = [h for h in state.history if "train/loss" in h]
    metrics = {
        "steps": state.step,
        "epochs": state.epoch - (state.update_in_epoch == 0),
        "stop_reason": stop_reason,
        # The plan beside what was done, so that every page can say when a time limit cut the run short.
        "max_steps": p.max_steps,
        "max_minutes": p.max_minutes,
        "resumed_from_step": state.resumed_from_step,
        "skipped_updates": state.skipped_updates,
        "best_step": state.best_step,
        "best_valid_loss": _rounded(state.best_valid_loss, 4),
        "best_valid_bleu": _rounded(state.best_valid_bleu, 2),
        "final_model": final_model,
        "final_valid_loss": _rounded(final_valid_loss, 4),
        "final_train_loss": _rounded(train_rows[-1]["train/loss"], 4) if train_rows else None,
        "tgt_tokens_per_s": round(float(np.median([h["train/tgt_tokens_per_s"] for h in train_rows])), 1)
        if train_rows else None,
        "train_seconds": round(state.seconds(), 1),
        "parameters": count_parameters(run.model),
        "trained_parameters": count_parameters(run.model, trainable_only=True),
        "processes": run.dist.world,
        "update_freq": p.update_freq,
        "precision": p.precision,
        "precision_reason": run.precision_reason,
        "device": run.device.type,
        "deterministic": p.deterministic,
        "truncated_pairs": run.data.train.truncated(),
    }
    if len(run.data.directions) > 1:
        metrics["directions"] = direction_metrics(state, run)
    return metrics


def direction_metrics(state: TrainState, run: Run) -> dict[str, dict[str, Any]]:
    best = best_figures(state.history, state.best_step, run.data.directions)
    return {name: {"train_pairs": len(run.data.train_rows[d]), "epoch_pairs": run.data.epochs.counts[d],
                   "best_valid_loss": _rounded(best[name]["best_valid_loss"], 4),
                   "best_valid_bleu": _rounded(best[name]["best_valid_bleu"], 2)}
            for d, name in enumerate(run.data.directions)}


def train(spec: dict[str, Any], on_update: UpdateHook | None = None) -> dict[str, Any]:
    """One training run, as the module docstring describes; rank 0 returns the metrics, other ranks {}.
    `on_update(rank, step)` runs before each update (where a caller hooks in, such as a test injecting a fault)."""
    dist = Distributed()
    threads = spec["train"]["threads"] or max(1, usable_cores() // dist.world)
    # The process group is torn down on every way out: a process that exits with a live one (after an error
    # such as CheckpointMismatch) can abort in the collective library's threads instead of exiting with the error.
    try:
        with kernel_settings(dist.device, threads, spec["train"]["deterministic"]):
            run = setup(spec, dist, threads)
            state = restore(run)
            if dist.is_main:
                p = run.train_params
                log.info("model: %s parameters (%s trained%s%s), %d train batches in epoch 1 (max_tokens %d), "
                         "%d process(es) x update_freq %d, %s on %s%s, %d thread(s)%s",
                         f"{count_parameters(run.model):,}", f"{count_parameters(run.model, trainable_only=True):,}",
                         f"; frozen: {', '.join(p.freeze)}" if p.freeze else "",
                         ", gradient checkpointing" if p.gradient_checkpointing else "", len(run.data.epochs(1)[0]),
                         p.max_tokens, dist.world, p.update_freq, p.precision, dist.device.type,
                         " (TF32 matmuls)" if dist.device.type == "cuda" and p.precision == "fp32" else "", threads,
                         ", deterministic kernels" if p.deterministic else "")
                log.info("precision %s (%s)", p.precision, run.precision_reason)
            stop_reason = fit(state, run, on_update)
            return finish(state, run, stop_reason)
    finally:
        dist.close()


def main(argv: list[str]) -> None:
    """torchrun worker entry: `python -m stages.train.loop spec.json` (written by the train stage)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        metrics = train(spec)
    except PipelineError as err:
        log.error("train failed on rank %s: %s", os.environ.get("RANK", "0"), err)
        sys.exit(1)
    if metrics and spec.get("metrics_file"):
        write_json(Path(spec["metrics_file"]), metrics)


if __name__ == "__main__":
    main(sys.argv[1:])
