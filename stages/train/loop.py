"""The training loop: one readable file, nanoGPT-style. DDP and AMP are in plain sight.

Run in the stage's own process (`train(spec)`), or by torchrun with one process per device: the stage relaunches
itself as `torchrun ... -m stages.train.loop spec.json` when `train.nproc` > 1. The spec is plain JSON (the
validated train params, the model settings, the project root), so this module and its workers import only
torch, transformers, numpy and, when installed, dvclive (with psutil) and sacrebleu: the loop runs on a GPU
machine that has nothing else of this project's dependencies (bench/gpu_train.sh runs it there).

An update consumes `world x update_freq` token-bucketed batches (batching.py says which rank gets which). Its
gradient is that of the summed token losses of all those batches divided by their real target tokens, so it is
the same whether the batches are spread over processes or accumulated in one: 2 processes x 1 micro-batch and
1 process x 2 micro-batches take the same update (up to float rounding; dropout masks differ).

Exact resume: models/checkpoints/last.pt (see checkpoint.py) holds the model, optimizer, schedule, GradScaler,
every rank's RNG states and the data position (epoch + update index in that epoch's batch list, which is a pure
function of the seed and the epoch). A run started while a matching last.pt exists continues from it and takes
exactly the updates the uninterrupted run would have taken.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from pipeline.artifacts import write_json
from pipeline.errors import PipelineError
from pipeline.token_arrays import TokenArray
from stages.train import checkpoint
from stages.train.batching import (
    IGNORE_INDEX,
    Batch,
    Collator,
    epoch_batches,
    length_batches,
    update_target_tokens,
)
from stages.train.bleu import ValidBleu
from stages.train.live import Logger, SystemFigures
from stages.train.model import build_model, count_parameters, pad_embedding_rows
from stages.train.save import save_final

log = logging.getLogger("mtpipe.train")
LN2 = math.log(2)


class TrainingDiverged(PipelineError):
    def __init__(self, step: int, in_a_row: int, precision: str):
        hint = ", or train in bf16 instead of fp16" if precision == "fp16" else ""
        super().__init__(
            f"training diverged: {in_a_row} updates in a row after update {step} had a non-finite loss or gradient "
            f"(train.max_bad_steps = {in_a_row}); lower train.lr or raise train.warmup_steps{hint}"
        )


def inverse_sqrt(step: int, warmup: int) -> float:
    """Linear warmup to 1, then decay with 1/sqrt(step) (Vaswani et al. 2017)."""
    step = max(step, 1)
    if warmup == 0:
        return 1.0
    return min(step / warmup, math.sqrt(warmup / step))


class Distributed:
    """Rank and world from the torchrun environment; a single process when it is absent."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
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
        """Every rank's `obj`, on every rank (only at checkpoints and at the end)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch_dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.world > 1 and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def to_device(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    fields = ("input_ids", "attention_mask", "decoder_input_ids", "labels")
    return {f: torch.from_numpy(getattr(batch, f)).to(device, non_blocking=True) for f in fields}


def uniform_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """torch.nn.functional.dropout with the mask drawn as uniform >= p: the same Bernoulli(1 - p) keep mask and
    1 / (1 - p) scaling, from the same generator, but on CPUs about 1.6x faster than PyTorch's bernoulli_ (5.5 ->
    3.5 ms for a 2048 x 256 activation, 2 threads), which made dropout ~9% of a cpu-ref training step."""
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return torch.zeros_like(x)
    return x * (torch.rand_like(x) >= p) * (1.0 / (1.0 - p))


@contextmanager
def cpu_dropout(device: torch.device) -> Iterator[None]:
    """On CPUs, transformers models call uniform_dropout for torch.nn.functional.dropout inside this block (they
    call the function, not a module, so it is swapped for the training forward pass only)."""
    if device.type != "cpu":
        yield
        return
    original = F.dropout
    F.dropout = uniform_dropout
    try:
        yield
    finally:
        F.dropout = original


def seq2seq_loss(model: Any, inputs: dict[str, torch.Tensor], label_smoothing: float) -> torch.Tensor:
    """Summed label-smoothed cross entropy over the real target tokens (labels are IGNORE_INDEX on padding)."""
    logits = model(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        decoder_input_ids=inputs["decoder_input_ids"],
        use_cache=False,
    ).logits
    return F.cross_entropy(
        logits.float().view(-1, logits.size(-1)),  # fp32 softmax under bf16/fp16 autocast
        inputs["labels"].view(-1),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


def parameter_digest(model: torch.nn.Module) -> str:
    """A hash of every parameter's bytes: DDP replicas must end bit-identical."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _injected_failure(rank: int, step: int) -> None:
    """MTPIPE_TRAIN_FAIL_AT=RANK:STEP makes that rank crash before that update (the test of a dying rank)."""
    if os.environ.get("MTPIPE_TRAIN_FAIL_AT") == f"{rank}:{step}":
        raise RuntimeError(f"rank {rank} failed on purpose before update {step} (MTPIPE_TRAIN_FAIL_AT)")


def train(spec: dict[str, Any]) -> dict[str, Any]:
    cfg = SimpleNamespace(**spec["train"])
    root = Path(spec["root"])
    tokenized = root / "data" / "tokenized"
    ckpt_dir = root / "models" / "checkpoints"
    dist = Distributed()
    device = dist.device
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // dist.world)
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed + dist.rank)  # dropout: each rank draws its own masks, as it has its own data

    # ---- data: pre-encoded arrays, token-bucketed batches fixed once for the whole run ----
    meta = json.loads((tokenized / "meta.json").read_text())
    arrays = {name: TokenArray.open(tokenized / name) for name in ("train.src", "train.tgt", "valid.src", "valid.tgt")}
    train_data = Collator(arrays["train.src"], arrays["train.tgt"], meta["pad_id"], cfg.max_len)
    valid_data = Collator(arrays["valid.src"], arrays["valid.tgt"], meta["pad_id"], cfg.max_len)
    batches = length_batches(*train_data.lengths(), cfg.max_tokens, cfg.seed)
    batch_tgt_tokens = train_data.target_tokens(batches)
    valid_batches = length_batches(*valid_data.lengths(), cfg.max_tokens, cfg.seed)
    per_update = dist.world * cfg.update_freq
    if len(batches) < per_update:
        raise PipelineError(f"{len(batches)} batches cannot feed one update of {dist.world} process(es) x "
                            f"update_freq {cfg.update_freq}; lower train.max_tokens or train.update_freq")

    # ---- model, DDP, AMP, optimizer, schedule ----
    model = build_model(spec["model"], meta["vocab_size"], meta["pad_id"], meta["eos_id"], seed=cfg.seed,
                        joint_vocab=meta.get("joint", True))
    model.to(device)
    # DDP wraps the model for the training forward (its hooks all-reduce gradients in backward());
    # validation, decoding and saving use the bare model.
    ddp_model = DDP(model) if dist.world > 1 else model
    # AMP: chosen once. bf16 needs no loss scaling; fp16 does (GradScaler); fp32 runs without autocast.
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()

    scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
    # Fused AdamW: one kernel per parameter group and step, on CPUs as on GPUs.
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9,
                                  weight_decay=cfg.weight_decay, fused=device.type in ("cuda", "cpu"))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: inverse_sqrt(s + 1, cfg.warmup_steps))
    # Keep the <pad> embedding rows at zero (Marian/CTranslate2 decode from a zero start vector). A pretrained
    # checkpoint's rows are left as they were trained.
    from_scratch = spec["model"]["init"] == "scratch"
    pad_rows = pad_embedding_rows(model, meta["pad_id"]) if from_scratch else []

    # ---- what a checkpoint carries besides the tensors ----
    progress: dict[str, Any] = {
        "step": 0, "epoch": 1, "update_in_epoch": 0, "train_seconds": 0.0, "skipped_updates": 0,
        "best_valid_loss": math.inf, "best_step": 0, "best_valid_bleu": None, "stale_validations": 0,
        "last_validated": 0, "last_saved": 0, "history": [],
        "window": {"loss": 0.0, "tgt": 0, "src": 0, "padded": 0, "seconds": 0.0, "updates": 0},
    }
    fingerprint = checkpoint.fingerprint(spec, dist.world, tokenized)
    resumed = checkpoint.resumable(ckpt_dir / checkpoint.LAST, fingerprint, cfg.max_steps)
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        schedule.load_state_dict(resumed["schedule"])
        scaler.load_state_dict(resumed["scaler"])
        checkpoint.set_rng_state(resumed["rng"][dist.rank], device)
        progress = resumed["progress"]
        if dist.is_main:
            log.info("resuming from %s at update %d (epoch %d, update %d of the epoch)", ckpt_dir / checkpoint.LAST,
                     progress["step"], progress["epoch"], progress["update_in_epoch"])
    if dist.world > 1:
        torch_dist.barrier()  # every rank has read last.pt before rank 0 may clear it
    if resumed is None and dist.is_main:
        checkpoint.clear(ckpt_dir)
    del resumed  # the tensors were copied into the model and optimizer
    resumed_at = progress["step"] or None
    window = progress["window"]
    window_loss = torch.tensor(window["loss"], dtype=torch.float64, device=device)  # summed on device: no sync

    logger = Logger(root / "dvclive", dist.is_main, progress["history"])
    system = SystemFigures(device)
    bleu = ValidBleu(valid_data, tokenized / "hf_tokenizer", cfg.valid_bleu_sentences if dist.is_main else 0,
                     cfg.seed, cfg.max_tokens)
    if dist.is_main:
        log.info("model: %s parameters, %d train batches (max_tokens %d), %d process(es) x update_freq %d, %s, "
                 "%d thread(s)", f"{count_parameters(model):,}", len(batches), cfg.max_tokens, dist.world,
                 cfg.update_freq, cfg.precision, threads)

    def record(row: dict[str, float]) -> None:
        progress["history"].append(row)
        logger.log(row)

    def valid_loss_sum(batch_list: list[np.ndarray]) -> tuple[float, float]:
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=device)
        tokens = 0
        with torch.no_grad(), autocast():
            for idx in batch_list:
                batch = valid_data(idx)
                total += seq2seq_loss(model, to_device(batch, device), 0.0)
                tokens += batch.tgt_tokens
        model.train()
        return total.item(), float(tokens)

    def validate() -> bool:
        """Valid loss (bits/token, sharded over ranks) and, on rank 0, BLEU; True when the loss is the best yet."""
        loss_total, tokens = dist.sum(list(valid_loss_sum(valid_batches[dist.rank :: dist.world])))
        step = progress["step"]
        row = {"step": step, "valid/loss": loss_total / max(tokens, 1) / LN2}
        if bleu.enabled:
            row["valid/bleu"] = bleu(model, device, autocast)
        improved = row["valid/loss"] < progress["best_valid_loss"]
        if improved:
            progress.update(best_valid_loss=row["valid/loss"], best_step=step, stale_validations=0,
                            best_valid_bleu=row.get("valid/bleu"))
        else:
            progress["stale_validations"] += 1
        progress["last_validated"] = step
        if dist.is_main:
            record(row)
            log.info("step %d valid loss %.3f bits/token%s%s", step, row["valid/loss"],
                     f" BLEU {row['valid/bleu']:.2f}" if "valid/bleu" in row else "", " (best)" if improved else "")
        return improved

    def log_window() -> bool:
        """Log the figures since the last log line; True when the time limit is reached (a shared decision)."""
        elapsed = time.perf_counter() - t_origin
        over_time = float(cfg.max_minutes is not None and elapsed >= cfg.max_minutes * 60)
        loss_total, tgt, src, padded, over_time = dist.sum(
            [window_loss.item(), window["tgt"], window["src"], window["padded"], over_time])
        step = progress["step"]
        if dist.is_main:
            row = {
                "step": step,
                "train/loss": loss_total / max(tgt, 1) / LN2,
                "train/lr": schedule.get_last_lr()[0],
                "train/tgt_tokens_per_s": tgt / max(window["seconds"], 1e-9),
                "train/padding_efficiency": (src + tgt) / max(padded, 1),
                "train/grad_norm": last_grad_norm,
                "train/skipped_updates": progress["skipped_updates"],
                **system(),
            }
            record(row)
            log.info("step %d epoch %d loss %.3f lr %.2e %.0f tgt tok/s pad-eff %.2f", step, progress["epoch"],
                     row["train/loss"], row["train/lr"], row["train/tgt_tokens_per_s"],
                     row["train/padding_efficiency"])
        window.update(tgt=0, src=0, padded=0, seconds=0.0, updates=0)
        window_loss.zero_()
        return over_time > 0

    def save(names: list[str]) -> None:
        """Write the full training state under the first name, hard-link the others (rank 0 writes)."""
        rngs = dist.gather(checkpoint.rng_state(device))  # every rank's dropout RNG, for an exact resume
        progress["train_seconds"] = time.perf_counter() - t_origin
        if checkpoint.LAST in names:
            progress["last_saved"] = progress["step"]
        if not dist.is_main:
            return
        state = {
            "fingerprint": fingerprint,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rngs,
            "progress": {**progress, "window": {**window, "loss": window_loss.item()}},
        }
        checkpoint.save_atomic(state, ckpt_dir / names[0])
        for name in names[1:]:
            checkpoint.link_atomic(ckpt_dir / names[0], ckpt_dir / name)
        if checkpoint.LAST in names and cfg.average_last > 1:
            weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            checkpoint.save_average_snapshot(weights, ckpt_dir, progress["step"], cfg.average_last)

    def limit_reached() -> str:
        """The limits every rank sees alike (the time limit is decided at log steps, over all ranks)."""
        if progress["step"] >= cfg.max_steps:
            return "max_steps"
        if cfg.max_epochs is not None and progress["epoch"] > cfg.max_epochs:
            return "max_epochs"
        if cfg.patience is not None and progress["stale_validations"] >= cfg.patience:
            return "early_stopping"
        return ""

    # ---- the loop ----
    t_origin = time.perf_counter() - progress["train_seconds"]  # max_minutes counts time across resumes
    last_grad_norm = math.nan
    bad_in_a_row = 0
    # A resumed run may have nothing left to do (its checkpoint's time is the same on every rank).
    stop_reason = limit_reached()
    if cfg.max_minutes is not None and progress["train_seconds"] >= cfg.max_minutes * 60:
        stop_reason = stop_reason or "max_minutes"
    ddp_model.train()
    while not stop_reason:
        epoch = progress["epoch"]
        my_batches = epoch_batches(batches, epoch, cfg.seed, dist.rank, dist.world, cfg.update_freq)
        update_tokens = update_target_tokens(batch_tgt_tokens, epoch, cfg.seed, per_update)
        while progress["update_in_epoch"] < len(update_tokens) and not stop_reason:
            u = progress["update_in_epoch"]
            t_update = time.perf_counter()
            _injected_failure(dist.rank, progress["step"] + 1)
            # DDP averages gradients over ranks; times world / (the update's target tokens) makes the result the
            # gradient of the update's summed token loss per target token.
            scale = dist.world / float(update_tokens[u])
            micro_batches = my_batches[u * cfg.update_freq : (u + 1) * cfg.update_freq]
            update_loss = torch.zeros((), dtype=torch.float64, device=device)
            counts = np.zeros(3, dtype=np.int64)  # real target, real source and padded tokens
            for m, idx in enumerate(micro_batches):
                batch = train_data(idx)
                inputs = to_device(batch, device)
                # DDP all-reduces gradients inside backward(). no_sync() lets all but the last micro-batch only
                # accumulate locally, so an update costs one all-reduce whatever update_freq is.
                last_micro = m == len(micro_batches) - 1
                with ddp_model.no_sync() if dist.world > 1 and not last_micro else nullcontext():
                    with autocast(), cpu_dropout(device):
                        loss_sum = seq2seq_loss(ddp_model, inputs, cfg.label_smoothing)
                    scaler.scale(loss_sum * scale).backward()
                update_loss += loss_sum.detach()
                counts += (batch.tgt_tokens, batch.src_tokens, batch.padded_tokens)
            scaler.unscale_(optimizer)  # clip and check the true gradient, not the fp16-scaled one
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), cfg.clip_norm if cfg.clip_norm > 0 else math.inf)
            progress["update_in_epoch"] = u + 1
            # The one host sync of an update. The gradients were all-reduced, so every rank sees the same norm
            # and makes the same choice (a rank that stepped alone would leave the replicas out of step).
            last_grad_norm = grad_norm.item()
            finite = math.isfinite(last_grad_norm)
            if finite:
                scaler.step(optimizer)  # = optimizer.step() (with fp16: on the unscaled gradients)
                schedule.step()
                with torch.no_grad():
                    for row in pad_rows:
                        row.zero_()
                progress["step"] += 1
                bad_in_a_row = 0
            else:
                progress["skipped_updates"] += 1
                bad_in_a_row += 1
                if dist.is_main:
                    log.warning("non-finite loss or gradient after update %d: update skipped (%d in a row, %d in "
                                "all)", progress["step"], bad_in_a_row, progress["skipped_updates"])
                if bad_in_a_row >= cfg.max_bad_steps:
                    raise TrainingDiverged(progress["step"], bad_in_a_row, cfg.precision)
            scaler.update()  # fp16: lower the loss scale after an overflow, raise it after a long run without
            optimizer.zero_grad(set_to_none=True)
            window["seconds"] += time.perf_counter() - t_update
            if not finite:
                continue
            window_loss += update_loss
            window["updates"] += 1
            for key, n in zip(("tgt", "src", "padded"), counts.tolist(), strict=True):
                window[key] += n

            step = progress["step"]
            stop_reason = limit_reached()
            if step % cfg.log_every == 0 and log_window() and not stop_reason:
                stop_reason = "max_minutes"
            to_save = []
            if step % cfg.valid_every == 0 and validate():
                to_save.append(checkpoint.BEST)
            if step % cfg.save_every == 0:
                to_save.append(checkpoint.LAST)
            if to_save:
                save(to_save)
            stop_reason = stop_reason or limit_reached()
        if progress["update_in_epoch"] >= len(update_tokens):
            progress.update(epoch=epoch + 1, update_in_epoch=0)
            stop_reason = stop_reason or limit_reached()

    # ---- the end: last figures, validation and checkpoint at the final update ----
    if window["updates"]:
        log_window()
    to_save = []
    if progress["last_validated"] != progress["step"] and validate():
        to_save.append(checkpoint.BEST)
    if progress["last_saved"] != progress["step"]:
        to_save.append(checkpoint.LAST)
    if to_save:
        save(to_save)
    digests = dist.gather(parameter_digest(model))
    if len(set(digests)) != 1:  # checked before anything is written from them
        raise PipelineError(f"the {dist.world} DDP replicas ended with different parameters: {digests}")

    metrics: dict[str, Any] = {}
    if dist.is_main:
        if cfg.average_last > 1:
            weights, steps = checkpoint.average_snapshots(ckpt_dir, cfg.average_last)
            final_model = f"average of the checkpoints at updates {', '.join(map(str, steps))}"
        else:
            # Our own file; mmap: only the model's tensors are read, not the optimizer state.
            weights = torch.load(ckpt_dir / checkpoint.BEST, map_location="cpu", weights_only=False, mmap=True)["model"]
            final_model = f"best valid loss, update {progress['best_step']}"
        model.load_state_dict(weights)
        with torch.no_grad():
            for row in pad_rows:  # an average of zero rows is zero already; zeroed here so it visibly stays so
                row.zero_()
        final_valid_loss = progress["best_valid_loss"]
        if cfg.average_last > 1:
            loss_total, tokens = valid_loss_sum(valid_batches)
            final_valid_loss = loss_total / max(tokens, 1) / LN2
        train_rows = [h for h in progress["history"] if "train/loss" in h]
        metrics = {
            "steps": progress["step"],
            "epochs": progress["epoch"] - (progress["update_in_epoch"] == 0),
            "stop_reason": stop_reason,
            "resumed_from_step": resumed_at,
            "skipped_updates": progress["skipped_updates"],
            "best_step": progress["best_step"],
            "best_valid_loss": round(progress["best_valid_loss"], 4),
            "best_valid_bleu": progress["best_valid_bleu"] and round(progress["best_valid_bleu"], 2),
            "final_model": final_model,
            "final_valid_loss": round(final_valid_loss, 4),
            "final_train_loss": round(train_rows[-1]["train/loss"], 4) if train_rows else None,
            "tgt_tokens_per_s": round(float(np.median([h["train/tgt_tokens_per_s"] for h in train_rows])), 1)
            if train_rows else None,
            "train_seconds": round(time.perf_counter() - t_origin, 1),
            "parameters": count_parameters(model),
            "processes": dist.world,
            "update_freq": cfg.update_freq,
            "precision": cfg.precision,
            "truncated_pairs": train_data.truncated(),
            "replica_digests": sorted(set(digests)),  # one: every rank ended with the same parameters
        }
        save_final(model.cpu(), tokenized / "hf_tokenizer", root / "models" / "final")
        log.info("saved models/final (%s)", final_model)
        logger.close()
    dist.close()
    return metrics


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
