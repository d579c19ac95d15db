"""bench/decode.py runs as bench/README.md prints it: every path on a real export (the tiny model's, every format),
with a student beside the teacher, and its last line is one JSON object with every figure and goal. The figures
themselves are the bench's business, measured on a quiet machine; this only keeps the command working."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import MULTI30K, REPO

pytestmark = pytest.mark.e2e


def test_the_decode_bench_prints_every_path_and_the_students_goals(exported):
    if not (MULTI30K / "test_2016_flickr.en.gz").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    paths, _ = exported
    # The same export as teacher and student: the command's own paths, not the figures, are under test.
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "decode.py"), "--model", str(paths.final_model), "--export",
         str(paths.export), "--student", str(paths.export), "--limit", "6", "--skip", "onnx-1x2"],
        capture_output=True, text=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": ""}, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    measured = set(figures["paths"])
    assert {"generate", "onnx", "onnx-int8", "student-onnx", "student-int8"} <= measured
    if importlib.util.find_spec("ctranslate2") is not None:  # the export has its CTranslate2 model then
        assert "ctranslate2" in measured
    assert figures["sentences"] == 6 and figures["direction"] == "en-de"
    for path in measured:
        assert figures["paths"][path]["sentences_per_s"] > 0
    # One export as both: the student's graphs translate as the teacher's do.
    assert figures["paths"]["student-int8"]["bleu"] == figures["paths"]["onnx-int8"]["bleu"]
    assert {"student_int8_at_least_3x_teacher_int8", "student_bleu_within_1_of_teacher"} <= set(figures["goals"])
    assert figures["compute_bound"]["matmul_peak_gflops_per_s"] > 0


def test_the_decode_profile_sums_every_graphs_node_time_by_operator(exported):
    if not (MULTI30K / "test_2016_flickr.en.gz").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    paths, _ = exported
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "decode_profile.py"), "--export", str(paths.export), str(paths.export),
         "--int8", "--limit", "6"],
        capture_output=True, text=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": ""}, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["sentences"] == 6 and len(figures["exports"]) == 2
    for export in figures["exports"]:
        assert export["int8"] and 0 < export["inside_ort_share"] <= 1
        for graph in ("encoder", "decoder"):
            ops = export[graph]["ops"]
            assert export[graph]["runs"] >= 1 and export[graph]["node_ms"] > 0
            assert sum(op["share"] for op in ops.values()) == pytest.approx(1, abs=0.01)
        # The int8 decoder's matmuls are the quantised ones.
        assert "MatMulIntegerToFloat" in export["decoder"]["ops"] or "DynamicQuantizeMatMul" in export["decoder"]["ops"]


def test_the_generate_path_decodes_with_the_manifests_length_penalty(tiny_model_dir, monkeypatch):
    """Every path decodes by the export's own settings: `generate` with the manifest's length penalty, not the
    evaluate params' default (the ONNX paths' Translator takes the manifest's)."""
    import stages.evaluate
    from pipeline.runtime.model_languages import ModelLanguages
    from tests.conftest import bench_module

    used = []
    monkeypatch.setattr(stages.evaluate, "translate", lambda model, tokenizer, layout, sources, settings, **_:
                        used.append(settings) or ["" for _ in sources])
    bench = bench_module("decode")
    direction = ModelLanguages.read(tiny_model_dir).directions.directions[0]
    args = argparse.Namespace(threads=1, beam=4, max_tokens=2000, direction=direction)
    generation = SimpleNamespace(length_penalty=2.5, max_len_a=1.2, max_len_b=10)
    translate, _ = bench.generate_path(tiny_model_dir, generation, args)
    translate(["A man rides a horse."])
    assert [(s.length_penalty, s.beam, s.max_len_a, s.max_len_b) for s in used] == [(2.5, 4, 1.2, 10)]
