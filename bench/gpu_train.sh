#!/usr/bin/env bash
# GPU throughput of the training loop (stages/train/loop.py, the train stage's own code): the base and big
# presets in bf16 on synthetic token data, one GPU. Prints target tokens/s, model FLOP/s as a share of the GPU's
# dense bf16 peak (MFU) and peak memory; the last line is one JSON object.
#
# Needs only torch, transformers and numpy (a bare GPU machine with a copy of this repository); about 4-5
# minutes with the defaults. Run from anywhere:
#   bench/gpu_train.sh [--seconds 45] [--max-tokens 16384] [--peak-tflops 989] [--presets base,big]
#   bench/gpu_train.sh --dry-run      # 2 updates of tiny models on the CPU: checks the script, measures nothing
# --peak-tflops: dense bf16 peak of the GPU (H100/H200 SXM: 989; A100: 312; L40S: 362).
#
# Synthetic data: random token ids with WMT-like lengths (source 4-80 tokens, target about 1.1x source),
# a 32000-entry vocabulary; the batches, loss, AMP and optimizer are the real ones. FLOPs per target token
# are counted exactly for this encoder-decoder, as bench/train_throughput.py counts them.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" - "$@" <<'PY'
import argparse
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.getcwd())
from pipeline.token_arrays import TokenArrayWriter  # noqa: E402  (numpy only)
from stages.train import loop  # noqa: E402  (torch, transformers, numpy)
from stages.train.batching import Collator  # noqa: E402

spec = importlib.util.spec_from_file_location("train_throughput", "bench/train_throughput.py")
throughput = importlib.util.module_from_spec(spec)
spec.loader.exec_module(throughput)  # its top level imports only the standard library

PRESETS = {  # as pipeline/params.py (which needs pydantic, absent here)
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, attention_heads=8, ffn_dim=2048, dropout=0.1),
    "big": dict(d_model=1024, encoder_layers=6, decoder_layers=6, attention_heads=16, ffn_dim=4096, dropout=0.3),
    "tiny": dict(d_model=64, encoder_layers=2, decoder_layers=2, attention_heads=4, ffn_dim=256, dropout=0.1),
}
# Every train param the loop reads (pipeline.params.TrainParams, validated values written out).
TRAIN = dict(max_steps=10**9, max_epochs=None, max_minutes=None, lr=7e-4, warmup_steps=4000, weight_decay=0.0,
             label_smoothing=0.1, clip_norm=1.0, max_tokens=16384, update_freq=1, max_len=256, precision="bf16",
             max_bad_steps=16, nproc=1, threads=None, seed=1, log_every=50, valid_every=10**9,
             valid_bleu_sentences=0, patience=None, save_every=10**9, average_last=1)


def synthetic_corpus(root: Path, vocab: int, pairs: int, seed: int = 1) -> None:
    out = root / "data" / "tokenized"
    (out / "hf_tokenizer").mkdir(parents=True)
    pad_id, eos_id = vocab - 1, 0
    meta = {"vocab_size": vocab, "pad_id": pad_id, "eos_id": eos_id, "unk_id": 1, "joint": True, "dtype": "uint16"}
    (out / "meta.json").write_text(json.dumps(meta))
    rng = np.random.default_rng(seed)
    for split, n in (("train", pairs), ("valid", 256)):
        src_len = rng.integers(4, 81, n)
        tgt_len = np.clip(np.round(src_len * rng.normal(1.1, 0.15, n)), 3, 120).astype(np.int64)
        for side, lengths in (("src", src_len), ("tgt", tgt_len)):
            ids = rng.integers(2, vocab - 1, int(lengths.sum()))
            ends = np.cumsum(lengths)
            ids[ends - 1] = eos_id  # every sentence ends with </s>, as the tokenize stage writes them
            writer = TokenArrayWriter(out / f"{split}.{side}", np.dtype("uint16"))
            writer.add_flat(ids, lengths)
            writer.close()


def measure(preset: str, args: argparse.Namespace, root: Path, vocab: int) -> dict:
    """Train until --seconds after --warmup updates; tokens counted at collate, time at optimizer steps."""
    clock = throughput.StepClock(args.warmup, args.seconds, 3 if args.dry_run else 0)
    collate = Collator.__call__

    def counting(self, indices):
        batch = collate(self, indices)
        clock.count(batch.tgt_tokens, batch.src_tokens, batch.padded_tokens)
        return batch

    model = {"init": "scratch", "name_or_path": None, "arch": PRESETS[preset], "tie_embeddings": True,
             "max_positions": 512}
    train = {**TRAIN, "max_tokens": args.max_tokens}
    if args.dry_run:
        train["threads"] = 2
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    Collator.__call__ = counting
    started = time.perf_counter()
    try:
        loop.train({"root": str(root), "train": train, "model": model})
    except throughput.StopBenchmark:
        pass
    finally:
        Collator.__call__ = collate
    result = clock.result()
    d = PRESETS[preset]
    lengths = root / "data" / "tokenized"
    src_len = np.minimum(np.diff(np.load(lengths / "train.src.idx.npy")), train["max_len"])
    tgt_len = np.minimum(np.diff(np.load(lengths / "train.tgt.idx.npy")), train["max_len"])
    flops, rule = throughput.flops_per_target_token(d, vocab, src_len, tgt_len)
    achieved = result["tgt_tokens_per_s"] * flops
    peak_memory = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    return {
        "preset": preset, "tgt_tokens_per_s": round(result["tgt_tokens_per_s"], 1),
        "model_tflops": round(achieved / 1e12, 2), "mfu": round(achieved / (args.peak_tflops * 1e12), 4),
        "flops_per_tgt_token": round(flops), "flops_per_tgt_token_6n_rule": round(rule),
        "peak_memory_gib": round(peak_memory, 2), "padding_efficiency": round(result["padding_efficiency"], 3),
        "measured_updates": result["measured_updates"], "measured_seconds": result["measured_seconds"],
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="GPU throughput of the training loop (see the script header)")
    parser.add_argument("--presets", default="base,big")
    parser.add_argument("--seconds", type=float, default=45, help="measured seconds per preset, after warm-up")
    parser.add_argument("--warmup", type=int, default=15, help="updates left out of the measurement")
    parser.add_argument("--max-tokens", type=int, default=16384, help="padded tokens per batch")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--dry-run", action="store_true", help="2 updates of tiny models on the CPU")
    args = parser.parse_args(sys.argv[1:])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    presets = args.presets.split(",")
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before the first CUDA call: the loop picks the CPU
        presets, args.warmup, args.seconds, args.max_tokens, args.vocab, args.pairs = ["tiny"] * 2, 1, 1e9, 512, 500, 2000
    elif not torch.cuda.is_available():
        sys.exit("no GPU visible (use --dry-run to check the script on a CPU)")
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"{device}, torch {torch.__version__}, bf16, max_tokens {args.max_tokens}, peak {args.peak_tflops} TFLOP/s")
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-train-") as tmp:
        root = Path(tmp)
        synthetic_corpus(root, args.vocab, args.pairs)
        for preset in presets:
            r = measure(preset, args, root, args.vocab)
            results.append(r)
            print(f"{preset:>5}: {r['tgt_tokens_per_s']:10.0f} tgt tok/s  {r['model_tflops']:7.1f} TFLOP/s  "
                  f"MFU {r['mfu']:6.1%}  peak memory {r['peak_memory_gib']:.1f} GiB  "
                  f"({r['measured_updates']} updates in {r['measured_seconds']} s measured)", flush=True)
    print(json.dumps({"device": device, "torch": torch.__version__, "precision": "bf16",
                      "max_tokens": args.max_tokens, "peak_tflops": args.peak_tflops, "dry_run": args.dry_run,
                      "results": results}))


main()
PY
