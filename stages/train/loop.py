"""The training loop: one readable file, nanoGPT-style. DDP and AMP are in plain sight.

Launched as one process (`python -m stages.train`) or by torchrun with one process per device (the stage
relaunches itself through torchrun when `train.nproc` > 1). Imports only torch, transformers, numpy and,
when installed, dvclive: it runs on a GPU machine that has nothing else of this project's dependencies.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.params import Params
from pipeline.token_arrays import TokenArray
from stages.train.batching import IGNORE_INDEX, Batch, Collator, epoch_batches, length_batches
from stages.train.model import build_model, count_parameters, pad_embedding_rows
from stages.train.save import save_final

log = logging.getLogger("mtpipe.train")


def inverse_sqrt(step: int, warmup: int) -> float:
    """Linear warmup to 1, then decay with 1/sqrt(step) (Vaswani et al. 2017)."""
    step = max(step, 1)
    if warmup == 0:
        return 1.0
    return min(step / warmup, math.sqrt(warmup / step))


class Distributed:
    """Rank and world from the torchrun environment; a single process when it is absent."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world > 1:
            dist.init_process_group(backend="nccl" if self.device.type == "cuda" else "gloo")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float]) -> list[float]:
        """Sum figures over ranks (for logging and for the stop decision every rank must share)."""
        if self.world == 1:
            return values
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def close(self) -> None:
        import torch.distributed as dist

        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def to_device(batch: Batch, device: Any) -> dict[str, Any]:
    import torch

    fields = ("input_ids", "attention_mask", "decoder_input_ids", "labels")
    return {f: torch.from_numpy(getattr(batch, f)).to(device, non_blocking=True) for f in fields}


def seq2seq_loss(model: Any, inputs: dict[str, Any], label_smoothing: float) -> tuple[Any, int]:
    """Summed label-smoothed cross entropy over real target tokens, and how many there were."""
    import torch.nn.functional as F

    logits = model(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        decoder_input_ids=inputs["decoder_input_ids"],
        use_cache=False,
    ).logits
    labels = inputs["labels"]
    loss = F.cross_entropy(
        logits.float().view(-1, logits.size(-1)),
        labels.view(-1),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    return loss, int((labels != IGNORE_INDEX).sum())


class Logger:
    """DVCLive on rank 0 when it is installed; plain logging always."""

    def __init__(self, directory: Path, enabled: bool):
        self.live = None
        if enabled:
            try:
                from dvclive import Live
            except ImportError:
                log.info("dvclive not installed: curves go to the log only")
            else:
                # dvcyaml=None: dvc.yaml declares the plots itself; DVCLive must not rewrite it during `dvc repro`.
                self.live = Live(str(directory), dvcyaml=None, save_dvc_exp=False, report=None, resume=False)

    def log(self, step: int, figures: dict[str, float]) -> None:
        if self.live is None:
            return
        self.live.step = step
        for name, value in figures.items():
            self.live.log_metric(name, value)
        self.live.make_summary()

    def close(self) -> None:
        if self.live is not None:
            self.live.end()


def train(params: Params, root: Path) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = params.train
    dist = Distributed()
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // dist.world)
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed + dist.rank)

    tokenized = root / "data" / "tokenized"
    meta = json.loads((tokenized / "meta.json").read_text())
    train_data = Collator(
        TokenArray.open(tokenized / "train.src"), TokenArray.open(tokenized / "train.tgt"), meta["pad_id"], cfg.max_len
    )
    valid_data = Collator(
        TokenArray.open(tokenized / "valid.src"), TokenArray.open(tokenized / "valid.tgt"), meta["pad_id"], cfg.max_len
    )
    all_batches = length_batches(*train_data.lengths(), cfg.max_tokens, cfg.seed)
    valid_batches = length_batches(*valid_data.lengths(), cfg.max_tokens, cfg.seed)
    if len(all_batches) < dist.world:
        raise ValueError(f"{len(all_batches)} batches cannot feed {dist.world} processes; lower train.max_tokens")

    model = build_model(
        params.model, meta["vocab_size"], meta["pad_id"], meta["eos_id"], seed=cfg.seed, joint_vocab=meta.get("joint", True)
    )
    model.to(dist.device)
    ddp_model = DDP(model) if dist.world > 1 else model

    # AMP: chosen once. bf16 needs no loss scaling; fp16 does (GradScaler); fp32 runs without autocast.
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    autocast = (
        (lambda: torch.autocast(dist.device.type, dtype=amp_dtype)) if amp_dtype is not None else (lambda: nullcontext())
    )
    scaler = torch.amp.GradScaler(dist.device.type, enabled=cfg.precision == "fp16")

    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(0.9, 0.98),
        eps=1e-9,
        weight_decay=cfg.weight_decay,
        fused=dist.device.type == "cuda",
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: inverse_sqrt(s + 1, cfg.warmup_steps))
    # A checkpoint's own <pad> rows are left as trained; from scratch they stay zero (see pad_embedding_rows).
    pad_rows = pad_embedding_rows(model, meta["pad_id"]) if params.model.init == "scratch" else []

    logger = Logger(root / "dvclive", dist.is_main)
    if dist.is_main:
        log.info(
            "model: %s parameters, %d train batches (max_tokens %d) over %d process(es), %s, %d thread(s)",
            f"{count_parameters(model):,}", len(all_batches), cfg.max_tokens, dist.world, cfg.precision, threads,
        )

    def validate() -> float:
        model.eval()
        total = tokens = 0.0
        with torch.no_grad(), autocast():
            for idx in valid_batches[dist.rank :: dist.world]:
                loss, n = seq2seq_loss(model, to_device(valid_data(idx), dist.device), 0.0)
                total, tokens = total + loss.item(), tokens + n
        model.train()
        total, tokens = dist.sum([total, tokens])
        return total / max(tokens, 1) / math.log(2)  # bits per token

    start = time.perf_counter()
    step = epoch = 0
    best: dict[str, Any] = {"valid_loss": math.inf, "step": 0, "state": None}
    window = {"loss": 0.0, "tokens": 0, "src": 0, "padded": 0, "t0": time.perf_counter()}
    history: list[dict[str, float]] = []
    stop_reason = ""
    ddp_model.train()
    while not stop_reason:
        epoch += 1
        for idx in epoch_batches(all_batches, epoch, cfg.seed, dist.rank, dist.world):
            batch = train_data(idx)
            inputs = to_device(batch, dist.device)
            with autocast():
                loss_sum, ntokens = seq2seq_loss(ddp_model, inputs, cfg.label_smoothing)
            # Normalise by this batch's real target tokens: every rank's gradient is a per-token mean, and DDP
            # averages those.
            scaler.scale(loss_sum / max(ntokens, 1)).backward()
            scaler.unscale_(optimizer)
            if cfg.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            # Keep the <pad> embedding row at zero (Marian/CTranslate2 decode from a zero start vector).
            with torch.no_grad():
                for row in pad_rows:
                    row.zero_()
            step += 1

            window["loss"] += loss_sum.item()
            window["tokens"] += batch.tgt_tokens
            window["src"] += batch.src_tokens
            window["padded"] += batch.padded_tokens

            minutes = (time.perf_counter() - start) / 60
            if step >= cfg.max_steps:
                stop_reason = "max_steps"
            elif cfg.max_minutes is not None and minutes >= cfg.max_minutes:
                stop_reason = "max_minutes"
            if step % cfg.log_every == 0 or stop_reason:
                loss_total, tgt_tokens, src_tokens, padded, over_time = dist.sum(
                    [window["loss"], window["tokens"], window["src"], window["padded"], float(stop_reason != "")]
                )
                # Every rank must stop at the same step, or DDP's next all-reduce would wait forever.
                if over_time and not stop_reason:
                    stop_reason = "max_minutes"
                seconds = time.perf_counter() - window["t0"]
                figures = {
                    "train/loss": loss_total / max(tgt_tokens, 1) / math.log(2),
                    "train/lr": schedule.get_last_lr()[0],
                    "train/tgt_tokens_per_s": tgt_tokens / max(seconds, 1e-9),
                    "train/padding_efficiency": (src_tokens + tgt_tokens) / max(padded, 1),
                }
                history.append({"step": step, **figures})
                if dist.is_main:
                    logger.log(step, figures)
                    log.info(
                        "step %d epoch %d loss %.3f lr %.2e %.0f tgt tok/s pad-eff %.2f",
                        step, epoch, figures["train/loss"], figures["train/lr"],
                        figures["train/tgt_tokens_per_s"], figures["train/padding_efficiency"],
                    )
                window = {"loss": 0.0, "tokens": 0, "src": 0, "padded": 0, "t0": time.perf_counter()}
            if step % cfg.valid_every == 0 or stop_reason:
                valid_loss = validate()
                if dist.is_main:
                    logger.log(step, {"valid/loss": valid_loss})
                    log.info("step %d valid loss %.3f bits/token", step, valid_loss)
                if valid_loss < best["valid_loss"]:
                    state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
                    best = {"valid_loss": valid_loss, "step": step, "state": state}
            if stop_reason:
                break
        if cfg.max_epochs is not None and epoch >= cfg.max_epochs and not stop_reason:
            stop_reason = "max_epochs"

    wall = time.perf_counter() - start
    metrics: dict[str, Any] = {}
    if dist.is_main:
        model.load_state_dict(best["state"])
        train_log = [h for h in history if "train/tgt_tokens_per_s" in h]
        metrics = {
            "steps": step,
            "epochs": epoch,
            "stop_reason": stop_reason,
            "best_step": best["step"],
            "best_valid_loss": round(best["valid_loss"], 4),
            "final_train_loss": round(train_log[-1]["train/loss"], 4) if train_log else None,
            "tgt_tokens_per_s": round(float(np.median([h["train/tgt_tokens_per_s"] for h in train_log])), 1)
            if train_log else None,
            "wall_seconds": round(wall, 1),
            "parameters": count_parameters(model),
            "processes": dist.world,
            "precision": cfg.precision,
            "truncated_pairs": train_data.truncated(),
        }
        save_final(model, tokenized / "hf_tokenizer", root / "models" / "final")
        log.info("saved models/final (best valid loss %.3f at step %d)", best["valid_loss"], best["step"])
        logger.close()
    dist.close()
    return metrics
