"""The training engine's GPU-facing behaviour, checked on the CPU: fp16 with loss scaling, per-rank dropout
streams, one resume decision for all ranks, the process count against the devices, the best.pt fallback, the
running memory peak, kernel settings, the lagged booking of updates and the device-decided skip, prefetching."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from stages import tokenize, train
from tests.conftest import write_clean_splits

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SMALL = {"preset": "tiny", "d_model": 32, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1,
         "attention_heads": 2}
FAST = {"threads": 1, "valid_bleu_sentences": 0, "max_tokens": 1024, "lr": 3e-3, "warmup_steps": 10}


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tokenized")
    write_clean_splits(root, {"train": 1000, "valid": 60, "test": 10})
    tokenize.run(parse({"tokenize": {"vocab_size": 400}}), Paths(root))
    return root


def project(tokenized: Path, root: Path) -> Paths:
    (root / "data").mkdir(parents=True, exist_ok=True)
    if not (root / "data" / "tokenized").exists():
        (root / "data" / "tokenized").symlink_to(tokenized / "data" / "tokenized")
    return Paths(root)


def run_training(tokenized: Path, root: Path, **train_settings) -> tuple[Paths, dict]:
    paths = project(tokenized, root)
    raw = {"model": SMALL, "train": {"max_steps": 12, "valid_every": 6, "log_every": 3, **FAST, **train_settings}}
    return paths, train.run(parse(raw), paths)


def spec_file(tokenized: Path, root: Path, **train_settings) -> Path:
    paths = project(tokenized, root)
    spec = train.train_spec(parse({"model": SMALL, "train": {**FAST, **train_settings}}), paths)
    path = root / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(code: str, args: list[list[str]]) -> list[dict]:
    """Run `code` as rank 0 and rank 1 of a gloo process group (each gets its own argv); their last stdout lines,
    parsed as JSON."""
    port = str(free_port())
    procs = []
    for rank, rank_args in enumerate(args):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", code, *rank_args], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_fp16_autocast_with_grad_scaler_skips_an_overflow_lowers_the_scale_and_trains_on(tokenized, tmp_path,
                                                                                          monkeypatch):
    import torch

    from stages.train import loop

    real, seen = loop.seq2seq_loss, {"calls": 0, "fp16": 0}

    def overflow_on_third(model, inputs, label_smoothing, *scale):
        loss = real(model, inputs, label_smoothing, *scale)
        if model.training:
            seen["calls"] += 1
            seen["fp16"] += torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
            if seen["calls"] == 3:
                return loss * float("inf")  # what an fp16 overflow of the scaled loss looks like
        return loss

    monkeypatch.setattr(loop, "seq2seq_loss", overflow_on_third)
    paths, metrics = run_training(tokenized, tmp_path, precision="fp16", max_steps=10, save_every=10)
    assert seen["fp16"] == seen["calls"] == 11  # every training forward ran under fp16 autocast
    assert metrics["steps"] == 10 and metrics["skipped_updates"] == 1 and metrics["precision"] == "fp16"
    assert math.isfinite(metrics["best_valid_loss"]) and metrics["final_train_loss"] < math.log2(400)
    last = torch.load(paths.checkpoints / "last.pt", weights_only=False)
    assert last["scaler"]["scale"] == 2.0**16 * 0.5  # backed off once from the initial 2^16, not grown since


RANK_STREAM = """
import json, sys, torch
from stages.train import loop
from stages.train.distributed import Distributed
dist = Distributed()
spec = json.loads(open(sys.argv[1]).read())
run = loop.setup(spec, dist, 1)
print(json.dumps({"weights": loop.parameter_digest(run.model), "dropout_draws": torch.rand(8).tolist()}))
dist.close()
"""


def test_each_rank_draws_its_own_dropout_stream_from_the_same_initial_weights(tokenized, tmp_path):
    spec = str(spec_file(tokenized, tmp_path))
    rank0, rank1 = two_ranks(RANK_STREAM, [[spec], [spec]])
    assert rank0["weights"] == rank1["weights"]  # build_model seeds the weights alike on every rank...
    assert rank0["dropout_draws"] != rank1["dropout_draws"]  # ...and leaves each rank's own stream alone


AGREE = """
import json, sys
from pathlib import Path
from stages.train.distributed import Distributed
from stages.train.resume import agreed_resume
dist = Distributed()
try:
    state = agreed_resume(dist, Path(sys.argv[1]), {"digest": "d", "fields": {}}, 100)
    print(json.dumps({"resumed_at": None if state is None else state["progress"]["step"]}))
except Exception as err:
    print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
finally:
    dist.close()  # a process left with a live gloo group can abort at exit ("terminate called ...")
"""


def write_checkpoint(path: Path, step: int, save_id: str) -> str:
    from stages.train import checkpoint

    checkpoint.save_atomic({"fingerprint": {"digest": "d", "fields": {}}, "save_id": save_id,
                            "progress": {"step": step}}, path)
    return str(path)


def test_rank_0_decides_the_resume_and_ranks_that_see_another_checkpoint_stop_with_one_clear_error(tmp_path):
    shared = write_checkpoint(tmp_path / "shared" / "last.pt", 30, "a")
    assert two_ranks(AGREE, [[shared], [shared]]) == [{"resumed_at": 30}, {"resumed_at": 30}]

    # Rank 0 finds nothing to resume: nobody resumes, whatever stale file another rank has.
    stale = write_checkpoint(tmp_path / "node1" / "last.pt", 20, "b")
    missing = str(tmp_path / "node0" / "last.pt")
    assert two_ranks(AGREE, [[missing], [stale]]) == [{"resumed_at": None}, {"resumed_at": None}]

    # Rank 0 resumes; rank 1 sees an older checkpoint, or none: both ranks stop with the same error.
    for rank1_path, rank1_view in ((stale, "finds another checkpoint there (at update 20)"),
                                   (missing, "finds no readable checkpoint there")):
        results = two_ranks(AGREE, [[shared], [rank1_path]])
        assert results[0] == results[1]
        assert results[0]["error"].startswith(f"CheckpointMismatch: rank 0 resumes {shared} at update 30, but "
                                               f"rank 1 {rank1_view}: every rank must see the same")


def test_more_processes_than_gpus_is_a_clear_error(monkeypatch):
    import torch

    from pipeline.runtime.errors import PipelineError
    from stages.train.distributed import Distributed, TooFewDevices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert train.resolve_nproc("auto") == 2 and train.resolve_nproc(2) == 2
    with pytest.raises(PipelineError, match=r"train.nproc = 4, but this machine has 2 GPU\(s\): set train.nproc "
                                            r"to at most 2, or to auto"):
        train.resolve_nproc(4)

    # A worker started by hand with a LOCAL_RANK beyond the GPUs stops before torch's "invalid device ordinal".
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail(f"set_device({device}) was called"))
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(TooFewDevices, match="LOCAL_RANK 2 needs GPU 2, but 2 GPU"):
        Distributed()


def test_without_a_finite_validation_loss_models_final_holds_the_last_weights(tokenized, tmp_path, monkeypatch,
                                                                              caplog):
    from transformers import AutoModelForSeq2SeqLM

    from stages.train import loop

    real = loop.seq2seq_loss
    monkeypatch.setattr(loop, "seq2seq_loss", lambda m, i, ls, *scale: real(m, i, ls, *scale) if m.training else
                        real(m, i, ls) * float("nan"))
    with caplog.at_level(logging.WARNING, logger="mtpipe.train"):
        paths, metrics = run_training(tokenized, tmp_path, max_steps=6, valid_every=3)
    assert metrics["final_model"] == "last update, 6 (no validation had a finite loss, so there is no best.pt)"
    assert metrics["best_valid_loss"] is None and metrics["final_valid_loss"] is None
    assert not (paths.checkpoints / "best.pt").exists()
    assert json.loads(paths.metrics("train").read_text()) == metrics  # valid JSON: no NaN or Infinity in it
    assert AutoModelForSeq2SeqLM.from_pretrained(paths.final_model).config.d_model == 32
    assert "models/final holds the weights of the last update" in caplog.text


def test_gpu_memory_peak_is_a_running_peak_and_a_missing_nvml_is_said_once(monkeypatch, caplog):
    import torch

    from stages.train.live import SystemFigures

    readings = iter([3 * 2**30, 1 * 2**30, 2 * 2**30])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: next(readings))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 4 * 2**30)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: pytest.fail("peak was reset"))

    def no_nvml(device=None):
        raise ModuleNotFoundError("No module named 'pynvml'")

    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    system = SystemFigures(torch.device("cuda"))
    with caplog.at_level(logging.WARNING, logger="mtpipe.train"):
        rows = [system() for _ in range(3)]
    assert [r["system/gpu_mem_peak_gb"] for r in rows] == [3.0, 3.0, 3.0]
    assert all(r["system/gpu_mem_reserved_gb"] == 4.0 for r in rows)
    assert all("system/gpu_util_percent" not in r for r in rows)
    assert caplog.text.count("GPU utilisation is not logged: No module named 'pynvml'") == 1

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2**30)
    monkeypatch.setattr(torch.cuda, "utilization", lambda device=None: 87)
    assert SystemFigures(torch.device("cuda"))()["system/gpu_util_percent"] == 87.0


def test_kernel_settings_turn_on_tf32_on_cuda_and_deterministic_kernels_and_put_everything_back(monkeypatch):
    import torch

    from stages.train.kernels import kernel_settings

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)

    def settings():
        return (torch.get_num_threads(), torch.get_float32_matmul_precision(),
                torch.are_deterministic_algorithms_enabled())

    before = settings()
    with kernel_settings(torch.device("cuda"), 1, deterministic=True):
        assert torch.get_num_threads() == 1 and torch.get_float32_matmul_precision() == "high"
        assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    with kernel_settings(torch.device("cpu"), 1, deterministic=False):
        assert torch.get_float32_matmul_precision() == before[1]  # CPUs: true fp32, nothing to switch
        assert not torch.are_deterministic_algorithms_enabled()
    assert settings() == before


def test_deterministic_switch_runs_on_cpu_with_the_same_weights_as_without(tokenized, tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file

    from stages.train import loop

    real, inside = loop.seq2seq_loss, []
    monkeypatch.setattr(loop, "seq2seq_loss", lambda m, i, ls, *scale: inside.append(
        torch.are_deterministic_algorithms_enabled()) or real(m, i, ls, *scale))
    default, _ = run_training(tokenized, tmp_path / "default", max_steps=6)
    assert not any(inside)
    inside.clear()
    strict, metrics = run_training(tokenized, tmp_path / "strict", max_steps=6, deterministic=True)
    assert inside and all(inside) and metrics["deterministic"] is True
    assert not torch.are_deterministic_algorithms_enabled()  # put back after the run
    a, b = (load_file(p.final_model / "model.safetensors") for p in (default, strict))
    assert all(torch.equal(a[k], b[k]) for k in a)  # on CPUs the default kernels are deterministic already


def test_the_host_books_an_update_after_queuing_the_next_one_except_where_something_follows_it(tokenized, tmp_path,
                                                                                                monkeypatch):
    from stages.train import loop

    events = []

    def traced(name, real, position):
        def wrapper(*args):
            result = real(*args)
            events.append(f"{name}{position(args, result)}")
            return result
        return wrapper

    step_of = {}  # plan index -> update number (1-based; no update is skipped here)

    def number(plan):
        return step_of.setdefault(plan.index, len(step_of) + 1)

    monkeypatch.setattr(loop, "forward_backward", traced("fb", loop.forward_backward, lambda a, r: number(a[1].plan)))
    monkeypatch.setattr(loop, "book", traced("book", loop.book, lambda a, r: number(a[2].plan)))
    _, metrics = run_training(tokenized, tmp_path, max_steps=8, log_every=4, valid_every=8, save_every=8)
    assert metrics["steps"] == 8
    # Updates 4 and 8 are followed by a log line (and at 8 validation, a checkpoint, the end): booked at once.
    # The others are booked while the next update is queued, after its forward and backward.
    assert events == ["fb1", "fb2", "book1", "fb3", "book2", "fb4", "book3", "book4",
                      "fb5", "fb6", "book5", "fb7", "book6", "fb8", "book7", "book8"]


def test_a_non_finite_gradient_skips_the_step_on_the_device_leaving_weights_and_moments_untouched():
    import torch

    from stages.train.batching import PlannedUpdate
    from stages.train.loop import apply_update
    from stages.train.prefetch import ReadyUpdate

    def make_run(weights):
        model = torch.nn.Linear(4, 3)
        model.load_state_dict(weights)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        return SimpleNamespace(model=model, optimizer=optimizer, scaler=torch.amp.GradScaler("cpu", enabled=False),
                               train_params=SimpleNamespace(clip_norm=1.0), pad_rows=[])

    def set_grads(run, value):
        for p in run.model.parameters():
            p.grad = torch.full_like(p, value)

    update = ReadyUpdate(PlannedUpdate(1, 0, 10, 5, []), [], 5, 5, 10)
    start = torch.nn.Linear(4, 3).state_dict()
    run, reference = make_run(start), make_run(start)
    set_grads(run, 0.5)
    assert apply_update(run, update, torch.zeros(())).grad_norm() == pytest.approx(0.5 * 15**0.5)
    weights = {k: v.clone() for k, v in run.model.state_dict().items()}
    moments = {k: v.clone() for k, v in run.optimizer.state[run.model.weight].items()}

    set_grads(run, float("nan"))
    assert math.isnan(apply_update(run, update, torch.zeros(())).grad_norm())
    assert all(torch.equal(v, weights[k]) for k, v in run.model.state_dict().items())
    assert all(torch.equal(v, moments[k]) for k, v in run.optimizer.state[run.model.weight].items())  # step too

    # The next finite update is the one an optimizer that never saw the NaN takes, bit for bit.
    set_grads(reference, 0.5)
    apply_update(reference, update, torch.zeros(()))
    for r in (run, reference):
        set_grads(r, -0.25)
        apply_update(r, update, torch.zeros(()))
    assert all(torch.equal(a, b) for a, b in zip(run.model.parameters(), reference.model.parameters(), strict=True))
    assert all(torch.equal(v, reference.optimizer.state[reference.model.weight][k])
               for k, v in run.optimizer.state[run.model.weight].items())


def small_collator(tmp_path: Path):
    from pipeline.token_arrays import TokenArray, TokenArrayWriter
    from stages.train.batching import Collator

    rng = np.random.default_rng(0)
    (tmp_path / "meta.json").write_text('{"dtype": "uint16"}')
    arrays = []
    for side in ("src", "tgt"):
        writer = TokenArrayWriter(tmp_path / side, np.dtype("uint16"))
        writer.add([rng.integers(1, 50, rng.integers(1, 12)).tolist() + [0] for _ in range(200)])
        writer.close()
        arrays.append(TokenArray.open(tmp_path / side))
    return Collator(*arrays, pad_id=99, max_len=8)


def test_prefetched_updates_are_the_planned_ones_in_order_built_ahead_and_errors_reach_the_loop(tmp_path):
    import torch

    from stages.train.batching import length_batches, planned_updates
    from stages.train.prefetch import Prefetcher

    collate = small_collator(tmp_path)
    batches = length_batches(*collate.lengths(), 64, seed=1)
    tokens = collate.target_tokens(batches)

    def plan():
        return planned_updates(lambda epoch: (batches, tokens), seed=1, rank=0, world=1, update_freq=2, epoch=1,
                               update_in_epoch=3)

    ahead, inline = Prefetcher(plan(), collate, torch.device("cpu"), 2), Prefetcher(plan(), collate,
                                                                                     torch.device("cpu"), 0)
    n_updates = len(batches) // 2
    for _ in range(n_updates + 3):  # into the next epoch
        a, b = next(ahead), next(inline)
        assert a.plan.epoch == b.plan.epoch and a.plan.index == b.plan.index
        assert a.tgt_tokens == sum(collate(i).tgt_tokens for i in a.plan.batches) == a.plan.target_tokens
        for x, y in zip(a.inputs, b.inputs, strict=True):
            assert all(torch.equal(x[k], y[k]) for k in x)
    assert (a.plan.epoch, a.plan.index) == (2, 5)
    deadline = time.monotonic() + 10
    while ahead.ready.qsize() < 2 and time.monotonic() < deadline:  # the thread fills the queue on its own
        time.sleep(0.01)
    assert ahead.ready.qsize() == 2
    ahead.close()
    assert not ahead.thread.is_alive()

    calls = {"n": 0}

    def failing(indices):
        calls["n"] += 1
        if calls["n"] == 5:
            raise ValueError("corrupt batch")
        return collate(indices)

    feed = Prefetcher(plan(), failing, torch.device("cpu"), 2)
    next(feed), next(feed)  # 4 batches: fine
    with pytest.raises(ValueError, match="corrupt batch"):
        next(feed)
    feed.close()
    assert not feed.thread.is_alive()


def test_train_time_bleu_decodes_with_the_evaluate_stage_length_rule(tokenized):
    import torch

    from pipeline.runtime.decoding import output_limit
    from pipeline.token_arrays import TokenArray
    from stages.train.batching import Collator
    from stages.train.bleu import ValidBleu
    from stages.train.model import build_model

    data = tokenized / "data" / "tokenized"
    meta = json.loads((data / "meta.json").read_text())
    valid = Collator(TokenArray.open(data / "valid.src"), TokenArray.open(data / "valid.tgt"), meta["pad_id"], 256)
    bleu = ValidBleu(valid, [np.arange(len(valid.src))], data / "hf_tokenizer", 20, seed=1, max_tokens=200,
                     max_len_a=0.5, max_len_b=3)
    model = build_model(parse({"model": SMALL}).model, meta["vocab_size"], meta["pad_id"], meta["eos_id"])
    asked = []

    def generate(input_ids, attention_mask, max_length, **settings):
        asked.append((input_ids.shape[1], max_length))
        return torch.full((input_ids.shape[0], 2), meta["eos_id"])

    model.generate = generate
    bleu(model, torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False))
    assert len(asked) > 1
    assert all(max_length == output_limit(width, 0.5, 3, 512) + 1 for width, max_length in asked)
