"""bench/train_throughput.py runs as bench/README.md prints it, on a corpus laid out as Multi30k's files: every
trainer trains, and the goals it prints follow from its own figures. Its model FLOPs per target token, the
numerator of every MFU it prints, are what torch's own FLOP counter counts on the real model's forward and
backward pass."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, bench_module, multi30k_lines

pytestmark = pytest.mark.e2e

BENCH = REPO / "bench" / "train_throughput.py"
TINY_MODEL = ["d_model=32", "ffn_dim=64", "encoder_layers=1", "decoder_layers=1", "attention_heads=2"]


@pytest.mark.parametrize(("encoder_layers", "decoder_layers", "src_len", "tgt_len"), [(2, 3, 11, 7), (1, 1, 3, 19)])
def test_the_exact_flop_count_is_what_torch_counts_on_the_model(encoder_layers, decoder_layers, src_len, tgt_len):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.params import ModelParams
    from stages.train.model import build_model, model_spec, training_attention

    params = ModelParams(preset="tiny", d_model=32, ffn_dim=48, encoder_layers=encoder_layers,
                         decoder_layers=decoder_layers, attention_heads=4, dropout=0.0)
    vocab = 97
    model = build_model(params, vocab_size=vocab, pad_id=1, eos_id=2)
    training_attention(model, torch.device("cpu"))  # the eager kernel the loop trains with on CPUs
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(3, vocab, (1, src_len), generator=generator)
    tgt = torch.randint(3, vocab, (1, tgt_len), generator=generator)
    with FlopCounterMode(display=False) as counter:
        model(input_ids=src, attention_mask=torch.ones_like(src), labels=tgt).loss.backward()
    bench = bench_module("train_throughput")
    per_token, _ = bench.flops_per_target_token(model_spec(params)["arch"], vocab, np.array([src_len]),
                                                np.array([tgt_len]))
    assert per_token * tgt_len == counter.get_total_flops()


def multi30k_layout(root: Path, pairs: int = 500, valid: int = 100) -> Path:
    """The first lines of Multi30k's train files, under the names its task-1 files have (train/val .en/.de.gz)."""
    root.mkdir()
    for lang in ("en", "de"):
        lines = multi30k_lines("train", lang, pairs + valid)
        for name, rows in (("train", lines[:pairs]), ("val", lines[pairs:])):
            with gzip.open(root / f"{name}.{lang}.gz", "wt", encoding="utf-8") as out:
                out.write("\n".join(rows) + "\n")
    return root


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), "--threads", "1", *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env={"HF_HUB_OFFLINE": "1", "PATH": ""})


def test_every_trainer_trains_and_the_goals_follow_from_the_figures(tmp_path):
    corpus = multi30k_layout(tmp_path / "multi30k")
    result = bench("--multi30k", str(corpus), "--seconds", "1", "--warmup-steps", "1", "--max-updates", "4",
                   "--precisions", "fp32", "--vocab-size", "800", "--max-tokens", "256", "--model", *TINY_MODEL)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["train_pairs"] == 500 and figures["model"] == "cpu-ref " + " ".join(TINY_MODEL)
    speeds = {}
    for trainer in ("ours", "hf", "hf_grouped"):
        key = f"{trainer}_fp32"
        assert figures[f"{key}_measured_updates"] >= 1, key
        assert 0 < figures[f"{key}_padding_efficiency"] <= 1, key
        speeds[trainer] = figures[f"{key}_tgt_tokens_per_s"]
        assert speeds[trainer] > 0, key
        share = speeds[trainer] * figures["train_flops_per_tgt_token"] / (figures["matmul_peak_fp32_gflops"] * 1e9)
        assert figures[f"{key}_peak_share"] == pytest.approx(share, abs=2e-3), key
    assert figures["goal_ratio_best_hf"] == pytest.approx(speeds["ours"] / max(speeds["hf"], speeds["hf_grouped"]),
                                                          abs=2e-3)
    assert figures["goal_ratio_pass"] == (figures["goal_ratio_best_hf"] >= 1.5)
    assert figures["goal_peak_share"] == figures["ours_fp32_peak_share"]
    assert ("PASS" if figures["goal_peak_share_pass"] else "MISS") in result.stdout


def test_the_profile_says_where_an_update_spends_its_time(tmp_path):
    corpus = multi30k_layout(tmp_path / "multi30k")
    result = bench("--multi30k", str(corpus), "--profile", "3", "--profile-precision", "fp32", "--vocab-size", "800",
                   "--max-tokens", "256", "--model", *TINY_MODEL)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert (figures["profile_updates"], figures["precision"]) == (3, "fp32")
    shares = figures["time_share_by_kind"]
    assert shares["matmul"] > 0 and sum(shares.values()) == pytest.approx(1.0, abs=0.01)
    assert figures["matmul_gflops"] > 0 and figures["matmul_peak_gflops"] > 0
    # Each figure is rounded on its own (GFLOP/s to 0.1, the share to 1e-4), so the product is only close.
    assert figures["matmul_peak_share"] * figures["matmul_peak_gflops"] == pytest.approx(figures["matmul_gflops"],
                                                                                         rel=0.01, abs=0.1)
    assert "matrix products by operand shapes" in result.stdout


def test_a_profile_without_a_peak_gives_the_products_rate_and_no_share(tmp_path, monkeypatch, capsys):
    """Where bf16 is emulated the bench measures no peak to profile against (main passes None): the products' own
    rate is still given, their share of a peak is not, and the printout says why."""
    import torch

    throughput = bench_module("train_throughput")
    corpus = multi30k_layout(tmp_path / "multi30k")
    monkeypatch.setattr(sys, "argv", ["train_throughput.py", "--threads", "1", "--multi30k", str(corpus), "--profile",
                                      "2", "--profile-precision", "fp32", "--vocab-size", "800", "--max-tokens", "256",
                                      "--model", *TINY_MODEL])
    args = throughput.arguments()
    work = tmp_path / "work"
    work.mkdir()
    throughput.opened_work(args, work)
    threads = torch.get_num_threads()
    try:
        figures = throughput.profile_ours(args, work, None)
    finally:
        torch.set_num_threads(threads)
    assert figures["matmul_gflops"] > 0
    assert figures["matmul_peak_gflops"] is None and figures["matmul_peak_share"] is None
    printed = capsys.readouterr().out
    assert "bf16 is emulated here, so no share of a peak" in printed and "of the peak" not in printed


def test_the_profile_counts_each_products_flops_from_its_operands():
    import torch
    from torch.profiler import ProfilerActivity, profile

    throughput = bench_module("train_throughput")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.addmm(torch.zeros(5), torch.ones(3, 4), torch.ones(4, 5))  # the bias is not an operand
        for _ in range(2):
            torch.bmm(torch.ones(6, 3, 4), torch.ones(6, 4, 2))
        torch.mm(torch.ones(7, 2), torch.ones(2, 9))
    rates = {r["op"]: r for r in throughput.matmul_rates(prof.key_averages(group_by_input_shape=True))}
    assert rates["addmm"]["flops"] == 2 * 3 * 4 * 5
    assert rates["bmm"]["flops"] == 2 * (2 * 6 * 3 * 4 * 2)
    assert rates["mm"]["flops"] == 2 * 7 * 2 * 9 and rates["mm"]["shapes"] == "(7, 2) x (2, 9)"
    assert all(r["seconds"] > 0 for r in rates.values())


def test_a_missing_corpus_is_named(tmp_path):
    result = bench("--multi30k", str(tmp_path / "nowhere"), "--seconds", "1")
    assert result.returncode != 0 and "Multi30k not found in" in result.stderr and "nowhere" in result.stderr
    assert "Traceback" not in result.stderr
