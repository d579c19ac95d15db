"""The GPU check of the training engine (stages/train): one run, about 6 minutes on one H100/H200, that settles
what the CPU tests cannot. Prints one line per check, then, as the last line, one JSON object with every figure.

    .venv/bin/python bench/gpu_check.py --prepare DIR   # here, with the project's venv: tokenized corpus + defaults
    bench/gpu_check.sh --data DIR                       # on the GPU machine, after copying DIR there
    bench/gpu_check.sh --dry-run                        # on a CPU: the same code path at toy sizes (prepares its
                                                        # own DIR in a temporary directory), under a minute

The GPU machine needs only a copy of this repository and a Python with torch, transformers, sentencepiece and
numpy (no pydantic, dvc or prefect: the check imports stages/train and nothing of the rest; its JSON lists any
module outside that set that got imported). `--prepare` writes DIR/data/tokenized (Multi30k en-de read from
../shared/data/multi30k, or the embedded sample when that is absent, through the tokenize stage) and
DIR/spec_defaults.json (the validated train/evaluate defaults and the model presets, so the check builds the
same spec the train stage would, without pydantic). DIR is a few MB and holds a `.gitignore` of its own, so git
leaves it out wherever it lies (data/ is ignored only for the stages' own outputs).

Checks, each recorded with its figures and PASS/FAIL (a failure does not stop the others):
- precisions: bf16, fp16 (GradScaler) and fp32 (TF32 matmuls on, checked inside the run) short runs of the base
  preset on the prepared corpus: finite and falling loss, valid BLEU decoded, a saved models/final that loads
  with AutoModelForSeq2SeqLM/AutoTokenizer and translates.
- resume: `python -m stages.train.loop` in bf16 with `train.deterministic: true`, once uninterrupted, once
  SIGKILLed past its first checkpoint and started again: the resumed run must continue from the checkpoint and
  end with the uninterrupted run's loss curve and weights, bit for bit (if deterministic kernels fail, the
  error is recorded and the check reruns without them, comparing to a relative tolerance).
- throughput: base and big presets in bf16 on synthetic token data with WMT-like lengths (32000 vocabulary):
  target tokens/s (median of the loop's own log windows after warm-up), MFU against a bf16 matmul peak
  measured in the same run (and against the 989 TFLOP/s datasheet peak), peak memory. Goal printed (not a
  failure): big >= 300k target tokens/s on one H200.
- gpu_busy: the share of wall time the GPU runs kernels (torch.profiler, 10 updates of the big preset) with
  the batch thread (prefetch) and without it (batches built in the loop's thread). Profiling slows the host,
  so both shares are lower bounds. Goal printed: >= 90%.
- nproc: train.nproc above the GPU count, and a worker whose LOCAL_RANK has no GPU, both stop with the clear
  error (GPU only).
- system figures: the logged peak memory never decreases; GPU utilisation is logged when nvidia-ml-py is there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Modules of the project's other stages that the GPU machine lacks (pyyaml comes with transformers).
PROJECT_ONLY = ("pydantic", "pyarrow", "pandas", "great_expectations", "dvc", "prefect", "datasets")
GOAL_BIG_TOKENS_PER_S = 300_000
GOAL_GPU_BUSY = 0.90
DATASHEET_BF16_TFLOPS = 989.0  # H100/H200 SXM dense bf16

# Sizes: (full GPU check, --dry-run on a CPU).
SIZES = {
    "precision": ({"preset": "base", "max_tokens": 8192, "max_steps": 100, "log_every": 10, "valid_every": 50,
                   "save_every": 50, "lr": 1e-3, "warmup_steps": 30, "valid_bleu_sentences": 64},
                  {"preset": "tiny", "max_tokens": 512, "max_steps": 8, "log_every": 2, "valid_every": 4,
                   "save_every": 4, "lr": 3e-3, "warmup_steps": 5, "valid_bleu_sentences": 4}),
    "resume": ({"preset": "base", "max_tokens": 8192, "max_steps": 60, "log_every": 5, "valid_every": 30,
                "save_every": 20, "lr": 1e-3, "warmup_steps": 30, "kill_after": 25},
               {"preset": "tiny", "max_tokens": 512, "max_steps": 16, "log_every": 4, "valid_every": 8,
                "save_every": 5, "lr": 3e-3, "warmup_steps": 5, "kill_after": 8}),
    "throughput": ({"presets": ("base", "big"), "max_tokens": 32768, "seconds": {"base": 35, "big": 50},
                    "vocab": 32000, "pairs": 200_000, "skip_windows": 2, "log_every": 10},
                   {"presets": ("tiny",), "max_tokens": 512, "steps": 8, "vocab": 500, "pairs": 2000,
                    "skip_windows": 1, "log_every": 2}),
    "busy": ({"preset": "big", "max_tokens": 32768, "wait": 8, "active": 10},
             {"preset": "tiny", "max_tokens": 512, "wait": 1, "active": 2}),
}
DRY_RUN_ARCH = {"d_model": 32, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1, "attention_heads": 2}


def load_module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------------------------
# --prepare (the project's venv)


def read_lines(path: Path) -> list[str]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def prepare(out: Path, multi30k: Path, pairs: int, vocab_size: int) -> None:
    """DIR/data/tokenized through the tokenize stage, and DIR/spec_defaults.json from the params schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.artifacts import Paths
    from pipeline.corpus import PAIR_SCHEMA
    from pipeline.params import EvaluateParams, ModelParams, TrainParams, parse
    from stages import tokenize
    from stages.train.model import model_spec

    if (multi30k / "train.en.gz").exists():
        source, files = str(multi30k), {"train": "train.{}.gz", "valid": "val.{}.gz"}
        folder = multi30k
    else:
        source, files, folder = "assets/sample", {"train": "train.{}", "valid": "valid.{}"}, REPO / "assets" / "sample"
    clean = out / "data" / "clean"
    clean.mkdir(parents=True, exist_ok=True)
    for split, pattern in files.items():
        src, tgt = (read_lines(folder / pattern.format(lang)) for lang in ("en", "de"))
        n = min(len(src), pairs) if split == "train" else min(len(src), 500)
        table = pa.table({"src": src[:n], "tgt": tgt[:n], "src_lang": ["en"] * n, "tgt_lang": ["de"] * n,
                          "origin": [pattern.format("en")] * n, "line": list(range(1, n + 1))}, schema=PAIR_SCHEMA)
        pq.write_table(table, clean / f"{split}.parquet")
    tokenize.run(parse({"tokenize": {"vocab_size": vocab_size}}), Paths(out))
    shutil.rmtree(clean)
    defaults = {
        "train": TrainParams().model_dump(),
        "evaluate": {k: v for k, v in EvaluateParams().model_dump().items() if k in ("max_len_a", "max_len_b")},
        "model": {p: model_spec(ModelParams(preset=p)) for p in ("tiny", "base", "big")},
        "prepared_from": source,
    }
    (out / "spec_defaults.json").write_text(json.dumps(defaults, indent=1))
    # A prepared corpus is a build product: git must not offer it for a commit, inside the repository or out.
    (out / ".gitignore").write_text("*\n")
    print(f"prepared {out} from {source}: copy it to the GPU machine, then bench/gpu_check.sh --data DIR")


# ---------------------------------------------------------------------------------------------------------------
# The checks (torch, transformers, numpy and stages/train only)


class Check:
    """Specs on top of the prepared defaults, fresh project roots, and the record of every result."""

    def __init__(self, data: Path, work: Path, dry_run: bool):
        self.data, self.work, self.dry_run = data, work, dry_run
        self.defaults = json.loads((data / "spec_defaults.json").read_text())
        self.results: dict[str, Any] = {}
        self.failed: list[str] = []

    def root(self, name: str, tokenized: Path | None = None) -> Path:
        root = self.work / name
        shutil.rmtree(root, ignore_errors=True)
        (root / "data").mkdir(parents=True)
        (root / "data" / "tokenized").symlink_to(tokenized or self.data / "data" / "tokenized")
        return root

    def spec(self, root: Path, preset: str, **train: Any) -> dict[str, Any]:
        model = dict(self.defaults["model"][preset])
        if self.dry_run:
            model["arch"] = {**model["arch"], **DRY_RUN_ARCH}
        return {"root": str(root), "train": {**self.defaults["train"], "threads": 2 if self.dry_run else None,
                                              **train},
                "model": model, "evaluate": self.defaults["evaluate"],
                "metrics_file": str(root / "metrics" / "train.json")}

    def record(self, name: str, figures: dict[str, Any], passed: bool | None) -> None:
        """passed None: figures only (goals are printed, not failed)."""
        figures = {**figures, "passed": passed}
        self.results[name] = figures
        if passed is False:
            self.failed.append(name)
        verdict = {True: "PASS", False: "FAIL", None: "info"}[passed]
        shown = {k: v for k, v in figures.items() if k != "passed"}
        print(f"{name:>22}: {verdict}  {json.dumps(shown, default=str)[:400]}", flush=True)

    def guarded(self, name: str, check: Any, *args: Any) -> None:
        """Run one check; an exception is that check's failure, recorded with its message."""
        try:
            check(self, name, *args)
        except Exception as err:  # the other checks still run
            import traceback

            self.record(name, {"error": f"{type(err).__name__}: {err}",
                               "where": traceback.format_exc().strip().splitlines()[-3:]}, False)


def history(root: Path) -> list[dict[str, float]]:
    """The run's logged rows, from its last checkpoint (dvclive may be absent on the GPU machine)."""
    import torch

    return torch.load(root / "models" / "checkpoints" / "last.pt", map_location="cpu", weights_only=False,
                      mmap=True)["progress"]["history"]


def translates(final: Path, tokenized: Path) -> list[str]:
    """Two valid sentences translated by the saved model, loaded as any user would load it."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from pipeline.token_arrays import TokenArray

    model = AutoModelForSeq2SeqLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    valid = TokenArray.open(tokenized / "valid.src")
    sources = tokenizer.batch_decode([valid[i].tolist() for i in range(2)], skip_special_tokens=True)
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, num_beams=2, max_length=40)
    return tokenizer.batch_decode(out, skip_special_tokens=True)


def check_precision(check: Check, name: str, precision: str) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from stages.train import loop

    size = dict(SIZES["precision"][check.dry_run])
    root = check.root(f"precision-{precision}")
    spec = check.spec(root, size.pop("preset"), precision=precision, **size)
    matmul = set()
    hook = register_optimizer_step_post_hook(lambda *_: matmul.add(torch.get_float32_matmul_precision()))
    try:
        started = time.perf_counter()
        metrics = loop.train(spec)
    finally:
        hook.remove()
    losses = [row["train/loss"] for row in history(root) if "train/loss" in row]
    outputs = translates(root / "models" / "final", root / "data" / "tokenized")
    cuda = torch.cuda.is_available()
    figures = {
        "steps": metrics["steps"], "skipped_updates": metrics["skipped_updates"], "first_loss": round(losses[0], 3),
        "last_loss": round(losses[-1], 3), "best_valid_loss": metrics["best_valid_loss"],
        "best_valid_bleu": metrics["best_valid_bleu"], "tgt_tokens_per_s": metrics["tgt_tokens_per_s"],
        "seconds": round(time.perf_counter() - started, 1), "fp32_matmul_in_run": sorted(matmul),
        "fp32_matmul_after": torch.get_float32_matmul_precision(), "translations": outputs,
    }
    passed = (metrics["steps"] == spec["train"]["max_steps"] and all(map(math.isfinite, losses))
              and metrics["best_valid_loss"] is not None and losses[-1] < losses[0]
              and len(outputs) == 2 and matmul == ({"high"} if cuda else {"highest"}))
    check.record(name, figures, passed)


def run_worker(spec: dict[str, Any], kill_after: int | None = None) -> tuple[int, list[str]]:
    """`python -m stages.train.loop spec.json` (the torchrun worker entry); SIGKILLed once it logs a step past
    `kill_after`. Returns its exit code and its log lines."""
    spec_path = Path(spec["root"]) / "spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, "-m", "stages.train.loop", str(spec_path)], cwd=REPO,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line.rstrip())
        words = line.split()
        if kill_after is not None and "step" in words and words.index("step") + 2 < len(words) \
                and words[words.index("step") + 2] == "epoch" and int(words[words.index("step") + 1]) >= kill_after:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=600)
    return proc.returncode, lines


def resume_once(check: Check, deterministic: bool) -> dict[str, Any]:
    import torch

    size = dict(SIZES["resume"][check.dry_run])
    preset, kill_after = size.pop("preset"), size.pop("kill_after")
    settings = {"precision": "bf16", "deterministic": deterministic, "valid_bleu_sentences": 0, **size}
    whole, split = check.root(f"resume-whole-{deterministic}"), check.root(f"resume-split-{deterministic}")
    code, lines = run_worker(check.spec(whole, preset, **settings))
    if code != 0:
        return {"error": f"uninterrupted run exited {code}: {' | '.join(lines[-3:])}"}
    code, _ = run_worker(check.spec(split, preset, **settings), kill_after=kill_after)
    ckpt = torch.load(split / "models" / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    killed_at = ckpt["progress"]["step"]
    code_again, lines = run_worker(check.spec(split, preset, **settings))
    if code_again != 0:
        return {"error": f"resumed run exited {code_again}: {' | '.join(lines[-3:])}"}
    metrics = json.loads((split / "metrics" / "train.json").read_text())
    a, b = (torch.load(r / "models" / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
            for r in (whole, split))
    loss_a = {row["step"]: row["train/loss"] for row in a["progress"]["history"] if "train/loss" in row}
    loss_b = {row["step"]: row["train/loss"] for row in b["progress"]["history"] if "train/loss" in row}
    rel = max(abs(loss_a[s] - loss_b[s]) / abs(loss_a[s]) for s in loss_a) if loss_a.keys() == loss_b.keys() else None
    return {"deterministic": deterministic, "kill_exit_code": code, "checkpoint_step": killed_at,
            "resumed_from_step": metrics["resumed_from_step"], "steps": metrics["steps"],
            "same_logged_steps": loss_a.keys() == loss_b.keys(), "max_rel_loss_diff": rel,
            "identical_weights": all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]),
            "max_steps": settings["max_steps"]}


def check_resume(check: Check, name: str) -> None:
    result = resume_once(check, deterministic=True)
    if "error" in result:
        first_error = result["error"]
        result = {**resume_once(check, deterministic=False), "deterministic_error": first_error}
    if "error" in result:
        check.record(name, result, False)
        return
    exact = result["deterministic"]
    resumed = (result["kill_exit_code"] == -signal.SIGKILL and 0 < result["checkpoint_step"] < result["max_steps"]
               and result["resumed_from_step"] == result["checkpoint_step"] and result["steps"] == result["max_steps"]
               and result["same_logged_steps"])
    same = (result["max_rel_loss_diff"] == 0.0 and result["identical_weights"]) if exact else (
        result["max_rel_loss_diff"] is not None and result["max_rel_loss_diff"] < 2e-2)
    check.record(name, result, resumed and same)


def synthetic_corpus(root: Path, vocab: int, pairs: int, seed: int = 1) -> Path:
    """Random ids with WMT-like lengths (source 4-80 tokens, target about 1.1x); every sentence ends in </s>."""
    import numpy as np

    from pipeline.runtime.languages import Directions
    from pipeline.runtime.model_languages import DirectionLayout, ModelLanguages, family_named
    from pipeline.token_arrays import TokenArrayWriter, write_row_directions

    out = root / "tokenized"
    (out / "hf_tokenizer").mkdir(parents=True)
    meta = {"vocab_size": vocab, "pad_id": vocab - 1, "eos_id": 0, "unk_id": 1, "joint": True, "dtype": "uint16"}
    (out / "meta.json").write_text(json.dumps(meta))
    # The layout the tokenize stage records for a one-direction model of its own: X </s>, decoding from <pad>.
    layout = DirectionLayout(source_prefix=(), source_suffix=(0,), target_prefix=(), target_suffix=(0,),
                             decoder_start=vocab - 1)
    ModelLanguages(Directions.of(["en-de"]), family_named("marian"), {}, {"en-de": layout}).write(out / "hf_tokenizer")
    rng = np.random.default_rng(seed)
    for split, n in (("train", pairs), ("valid", 256)):
        src_len = rng.integers(4, 81, n)
        tgt_len = np.clip(np.round(src_len * rng.normal(1.1, 0.15, n)), 3, 120).astype(np.int64)
        for side, lengths in (("src", src_len), ("tgt", tgt_len)):
            ids = rng.integers(2, vocab - 1, int(lengths.sum()))
            ids[np.cumsum(lengths) - 1] = 0
            writer = TokenArrayWriter(out / f"{split}.{side}", np.dtype("uint16"))
            writer.add_flat(ids, lengths)
            writer.close()
        write_row_directions(out / split, np.zeros(n, dtype=np.uint8))  # one direction: every row is en-de
    return out


def bf16_matmul_peak(dry_run: bool) -> float:
    """Best bf16 TFLOP/s of an n^3 matmul on this device."""
    import torch

    n, repeats = (512, 3) if dry_run else (8192, 20)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    best = 0.0
    for _ in range(repeats + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    return best / 1e12


def check_throughput(check: Check, name: str, synthetic: Path) -> None:
    import numpy as np
    import torch

    from stages.train import loop

    throughput = load_module("train_throughput", REPO / "bench" / "train_throughput.py")  # stdlib at top level
    size = SIZES["throughput"][check.dry_run]
    peak = bf16_matmul_peak(check.dry_run)
    figures: dict[str, Any] = {"bf16_matmul_peak_tflops": round(peak, 1), "max_tokens": size["max_tokens"]}
    src_len = np.minimum(np.diff(np.load(synthetic / "train.src.idx.npy")), 256)
    tgt_len = np.minimum(np.diff(np.load(synthetic / "train.tgt.idx.npy")), 256)
    for preset in size["presets"]:
        root = check.root(f"throughput-{preset}", synthetic)
        # A GPU run is timed (its speed is unknown beforehand); a dry run takes a fixed number of updates.
        limit = {"max_steps": size["steps"]} if "steps" in size else {"max_steps": 10**9,
                                                                       "max_minutes": size["seconds"][preset] / 60}
        spec = check.spec(root, preset, precision="bf16", max_tokens=size["max_tokens"], log_every=size["log_every"],
                          valid_every=10**9, save_every=10**9, valid_bleu_sentences=0, warmup_steps=4000, **limit)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            loop.train(spec)
        except torch.cuda.OutOfMemoryError as err:
            figures[preset] = {"error": f"out of memory at max_tokens {size['max_tokens']}: {err}"[:300]}
            continue
        windows = [r for r in history(root) if "train/tgt_tokens_per_s" in r]
        rows = windows[size["skip_windows"]:] or windows  # a run too short to leave out its warm-up keeps it
        rate = float(np.median([r["train/tgt_tokens_per_s"] for r in rows]))
        flops, _ = throughput.flops_per_target_token(spec["model"]["arch"], size["vocab"], src_len, tgt_len)
        figures[preset] = {
            "tgt_tokens_per_s": round(rate), "windows": len(rows), "model_tflops": round(rate * flops / 1e12, 1),
            "mfu_measured_peak": round(rate * flops / (peak * 1e12), 3),
            "mfu_datasheet_peak": round(rate * flops / (DATASHEET_BF16_TFLOPS * 1e12), 3),
            "gpu_mem_peak_gb": max((r.get("system/gpu_mem_peak_gb", 0.0) for r in rows), default=None),
            "gpu_util_percent": [r.get("system/gpu_util_percent") for r in rows][-3:],
        }
        shutil.rmtree(root, ignore_errors=True)  # checkpoints of the big preset are gigabytes
    big = figures.get("big", {}).get("tgt_tokens_per_s")
    if big is not None:
        figures["goal_big_300k_tokens_per_s"] = "PASS" if big >= GOAL_BIG_TOKENS_PER_S else "MISS"
    check.record(name, figures, all("error" not in figures[p] for p in size["presets"]))


def busy_share(check: Check, synthetic: Path, depth: int) -> float | None:
    """Kernel time / wall time over `active` profiled updates of the busy-check preset."""
    import torch
    from torch.autograd import DeviceType
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile, schedule

    from stages.train import loop

    size = SIZES["busy"][check.dry_run]
    cuda = torch.cuda.is_available()
    root = check.root(f"busy-{depth}", synthetic)
    spec = check.spec(root, size["preset"], precision="bf16", max_tokens=size["max_tokens"],
                      max_steps=size["wait"] + size["active"] + 4, log_every=10**9, valid_every=10**9,
                      save_every=10**9, valid_bleu_sentences=0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, schedule=schedule(wait=size["wait"], warmup=2, active=size["active"],
                                                                 repeat=1))
    stamps: list[float] = []
    hook = register_optimizer_step_post_hook(lambda *_: (stamps.append(time.perf_counter()), prof.step()))
    saved_depth, loop.PREFETCH_UPDATES = loop.PREFETCH_UPDATES, depth
    try:
        with prof:
            loop.train(spec)
    finally:
        loop.PREFETCH_UPDATES = saved_depth
        hook.remove()
        shutil.rmtree(root, ignore_errors=True)
    first = size["wait"] + 2
    wall_us = (stamps[first + size["active"]] - stamps[first]) * 1e6
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.CUDA)
    return round(kernel_us / wall_us, 3) if cuda else None


def check_busy(check: Check, name: str, synthetic: Path) -> None:
    figures = {"prefetch": busy_share(check, synthetic, depth=2), "no_prefetch": busy_share(check, synthetic, 0),
               "preset": SIZES["busy"][check.dry_run]["preset"]}
    if figures["prefetch"] is not None:
        figures["goal_busy_90_percent"] = "PASS" if figures["prefetch"] >= GOAL_GPU_BUSY else "MISS"
    check.record(name, figures, None)


def check_nproc(check: Check, name: str) -> None:
    import torch

    from pipeline.runtime.errors import PipelineError
    from stages.train import resolve_nproc
    from stages.train.distributed import Distributed, TooFewDevices

    if not torch.cuda.is_available():
        check.record(name, {"skipped": "no GPU"}, None)
        return
    gpus = torch.cuda.device_count()
    messages = {}
    try:
        resolve_nproc(gpus + 1)
    except PipelineError as err:
        messages["nproc"] = str(err)
    saved = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = str(gpus)
    try:
        Distributed()
    except TooFewDevices as err:
        messages["local_rank"] = str(err)
    finally:
        if saved is None:
            os.environ.pop("LOCAL_RANK")
        else:
            os.environ["LOCAL_RANK"] = saved
    check.record(name, {"gpus": gpus, **messages}, set(messages) == {"nproc", "local_rank"})


def check_system_figures(check: Check, name: str) -> None:
    import torch

    root = check.work / "precision-bf16"
    rows = [r for r in history(root) if "train/loss" in r]
    peaks = [r.get("system/gpu_mem_peak_gb") for r in rows]
    figures = {"gpu_mem_peak_gb": peaks, "gpu_util_percent": [r.get("system/gpu_util_percent") for r in rows],
               "nvidia_ml_py": importlib.util.find_spec("pynvml") is not None}
    if not torch.cuda.is_available():
        check.record(name, {**figures, "skipped": "no GPU"}, None)
        return
    running = None not in peaks and all(a <= b for a, b in zip(peaks, peaks[1:], strict=False))
    util = not figures["nvidia_ml_py"] or None not in figures["gpu_util_percent"]
    check.record(name, figures, running and util)


def run_checks(data: Path, dry_run: bool) -> dict[str, Any]:
    import torch
    import transformers

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    check = Check(data, work, dry_run)
    try:
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        print(f"{device}, torch {torch.__version__}, transformers {transformers.__version__}, "
              f"{'dry run' if dry_run else 'full check'}", flush=True)
        for precision in ("bf16", "fp16", "fp32"):
            check.guarded(f"precision_{precision}", check_precision, precision)
        check.guarded("system_figures", check_system_figures)
        check.guarded("resume_bf16", check_resume)
        check.guarded("nproc", check_nproc)
        size = SIZES["throughput"][dry_run]
        synthetic = synthetic_corpus(work / "synthetic", size["vocab"], size["pairs"])
        check.guarded("throughput", check_throughput, synthetic)
        check.guarded("gpu_busy", check_busy, synthetic)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    imported = sorted(m for m in PROJECT_ONLY if m in sys.modules)
    check.record("bare_python", {"imported_outside_torch_transformers_numpy": imported}, not imported)
    return {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
            "dry_run": dry_run, "data": str(data), "prepared_from": check.defaults["prepared_from"],
            "passed": not check.failed, "failed": check.failed, "checks": check.results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", type=Path, metavar="DIR", help="write the tokenized corpus and defaults")
    parser.add_argument("--data", type=Path, metavar="DIR", help="a directory --prepare wrote")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (prepares its own DIR)")
    parser.add_argument("--multi30k", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--pairs", type=int, default=30000, help="--prepare: training pairs kept")
    parser.add_argument("--vocab-size", type=int, default=8000, help="--prepare: SentencePiece vocabulary")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.prepare:
        prepare(args.prepare, args.multi30k, args.pairs, args.vocab_size)
        return
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported: everything runs on the CPU
    # As on the GPU machine, where it is not installed: the engine logs curves to the log only (the check reads
    # them from the checkpoints), and dvclive's own imports (dvc, pandas) stay out of the bare-python check.
    sys.modules["dvclive"] = None
    temporary = None
    if args.data is None:
        if not args.dry_run:
            sys.exit("--data DIR is needed (write DIR with --prepare, with the project's venv)")
        # A subprocess: the check's own process must stay free of the project's other dependencies.
        temporary = Path(tempfile.mkdtemp(prefix="gpu-check-data-"))
        subprocess.run([sys.executable, __file__, "--prepare", str(temporary), "--pairs", "2000", "--vocab-size",
                        "500", "--multi30k", str(args.multi30k)], check=True, stdout=subprocess.DEVNULL)
        args.data = temporary
    else:
        import torch

        if not args.dry_run and not torch.cuda.is_available():
            sys.exit("no GPU visible (use --dry-run to run the check's code path on a CPU)")
    try:
        summary = run_checks(args.data, args.dry_run)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    print(json.dumps(summary, default=str))
    sys.exit(0 if summary["passed"] else 1)


if __name__ == "__main__":
    main()
