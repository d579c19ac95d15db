"""The export stage: ONNX and TorchScript graphs of the model, a self-contained export directory, a parity gate.

One export of the tiny model (module-scoped) is shared by most assertions; the gate-failure and no-format cases run
the stage again on their own copies. The tiny model is untrained, so its logits are nearly flat and greedy argmaxes
can be decided by 1e-5; the copy used here has its (tied) embeddings scaled up so every argmax is decisive and the
greedy comparison tests the runtimes, not float noise. The stage's thresholds are the defaults.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifacts import Paths, read_json
from pipeline.errors import MissingArtifact, ParityFailed
from pipeline.params import parse
from stages import export

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")

REPO = Path(__file__).resolve().parents[2]
# Scales the untrained model's logits from std ~0.16 to ~1.6: top-2 margins go from ~1e-5 to ~0.5.
EMBEDDING_SCALE = 10.0
PARITY_SENTENCES = 32


def make_root(tiny_model_dir: Path, root: Path) -> Paths:
    """A project root with the fixture's cleaned splits and a sharpened copy of its model as models/final."""
    import torch
    from transformers import MarianMTModel

    paths = Paths(root)
    shutil.copytree(tiny_model_dir.parent.parent / "data" / "clean", paths.clean)
    shutil.copytree(tiny_model_dir, paths.final_model)
    model = MarianMTModel.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMBEDDING_SCALE)
    model.save_pretrained(paths.final_model)
    return paths


def export_params(**export_overrides):
    return parse({"export": {"parity_sentences": PARITY_SENTENCES, **export_overrides}})


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    paths = make_root(tiny_model_dir, tmp_path_factory.mktemp("export"))
    summary = export.run(export_params(), paths)
    return paths, summary


def load_model(paths: Paths):
    from transformers import AutoTokenizer, MarianMTModel

    return MarianMTModel.from_pretrained(paths.final_model).eval(), AutoTokenizer.from_pretrained(paths.final_model)


def batch(tokenizer, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    enc = tokenizer(sentences, padding=True, return_tensors="np")
    return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)


# --------------------------------------------------------------------------------------------------- the stage


def test_export_writes_onnx_and_torchscript_graphs_that_pass_the_onnx_checker(exported):
    import onnx

    paths, _ = exported
    for name in ("encoder.onnx", "decoder.onnx", "encoder.ts.pt", "decoder.ts.pt"):
        assert (paths.export / name).stat().st_size > 0, name
    for name in ("encoder.onnx", "decoder.onnx"):
        onnx.checker.check_model(str(paths.export / name))
        # external_data=False: the weights are inside the graph file, no `.onnx.data` beside it.
        assert not (paths.export / f"{name}.data").exists()


def test_metrics_report_parity_figures_under_the_thresholds(exported):
    paths, summary = exported
    params = export_params()
    metrics = read_json(paths.metrics("export"))
    assert metrics["n_sentences"] == PARITY_SENTENCES
    for fmt in ("onnx", "torchscript"):
        for graph in ("encoder", "decoder"):
            assert 0 <= metrics[fmt][f"{graph}_max_abs_diff"] <= params.export.max_logit_diff
            assert metrics[fmt]["export_seconds"][graph] > 0
            assert metrics[fmt]["size_mb"][graph] > 0
    assert metrics["identical_share"] >= params.export.min_identical
    assert metrics["emitted_pad"] is False
    assert metrics["bleu"]["delta"] <= 0.1
    assert summary == {
        "identical_share": metrics["identical_share"],
        "max_logit_diff": max(metrics[f][f"{g}_max_abs_diff"] for f in ("onnx", "torchscript") for g in export.GRAPHS),
        "bleu_delta": metrics["bleu"]["delta"],
    }


def test_export_dir_is_self_contained_with_tokenizer_config_and_manifest(exported):
    from transformers import AutoConfig, AutoTokenizer

    paths, _ = exported
    assert not list(paths.export.glob("*.safetensors")), "the PyTorch weights are not part of the export"
    tokenizer = AutoTokenizer.from_pretrained(paths.export)
    original = AutoTokenizer.from_pretrained(paths.final_model)
    sentence = "Two dogs play in the snow."
    assert tokenizer(sentence)["input_ids"] == original(sentence)["input_ids"]
    config = AutoConfig.from_pretrained(paths.export)
    assert (paths.export / "generation_config.json").is_file()

    manifest = read_json(paths.export / "export.json")
    assert manifest["files"]["onnx"] == {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
    assert manifest["files"]["torchscript"] == {"encoder": "encoder.ts.pt", "decoder": "decoder.ts.pt"}
    assert manifest["opset"] == export_params().export.opset
    assert manifest["vocab_size"] == config.vocab_size == len(tokenizer)
    # Marian layout: </s> = 0, <pad> = last id, decoding starts from <pad>.
    assert manifest["eos_id"] == 0
    assert manifest["pad_id"] == manifest["decoder_start_id"] == config.vocab_size - 1
    assert manifest["dims"]["d_model"] == config.d_model
    for name in manifest["model_files"]:
        assert (paths.export / name).is_file()


def test_onnx_graphs_accept_other_batch_sizes_and_lengths_than_the_trace(exported):
    import torch

    paths, _ = exported
    model, tokenizer = load_model(paths)
    encoder, decoder = export.export_wrappers(model)
    runtime = export.OrtModel(paths.export / "encoder.onnx", paths.export / "decoder.onnx")
    limit = export_params().export.max_logit_diff
    # The trace used batch 2 and a 3-token target prefix; try 3 and 1 sentences, 1 and 7 target tokens.
    for sentences, target_len in (
        (["A man.", "A woman in a red coat rides a bike down a long city street.", "Hello there"], 7),
        (["Only one sentence here, a bit longer than the others."], 1),
    ):
        ids, mask = batch(tokenizer, sentences)
        dec_ids = np.random.default_rng(0).integers(2, 900, size=(len(sentences), target_len))
        dec_ids[:, 0] = model.config.decoder_start_token_id
        with torch.no_grad():
            ref_hidden = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
            ref_logits = decoder(torch.from_numpy(dec_ids), ref_hidden, torch.from_numpy(mask)).numpy()
        hidden = runtime.encode(ids, mask)
        logits = runtime.decode(dec_ids, ref_hidden.numpy(), mask)
        assert hidden.shape == (len(sentences), ids.shape[1], model.config.d_model)
        assert logits.shape == (len(sentences), target_len, model.config.vocab_size)
        real = mask.astype(bool)
        assert np.abs(hidden[real] - ref_hidden.numpy()[real]).max() <= limit
        assert np.abs(logits - ref_logits).max() <= limit


def test_onnx_inputs_have_symbolic_batch_and_length_dims(exported):
    import onnx

    paths, _ = exported
    for name in ("encoder.onnx", "decoder.onnx"):
        graph = onnx.load(str(paths.export / name)).graph
        for tensor in graph.input:
            dims = tensor.type.tensor_type.shape.dim
            assert dims[0].dim_param and dims[1].dim_param, f"{name}:{tensor.name} has a fixed batch or length"


def test_torchscript_graphs_load_and_match_the_wrappers_on_a_new_shape(exported):
    import torch

    paths, _ = exported
    model, tokenizer = load_model(paths)
    encoder, decoder = export.export_wrappers(model)
    ts_encoder = torch.jit.load(str(paths.export / "encoder.ts.pt"))
    ts_decoder = torch.jit.load(str(paths.export / "decoder.ts.pt"))
    ids, mask = (torch.from_numpy(a) for a in batch(tokenizer, ["x", "A dog runs.", "Three people sit on a bench."]))
    dec_ids = torch.full((3, 5), model.config.decoder_start_token_id)
    with torch.no_grad():
        hidden = encoder(ids, mask)
        assert (ts_encoder(ids, mask) - hidden).abs().max() <= 1e-5
        assert (ts_decoder(dec_ids, hidden, mask) - decoder(dec_ids, hidden, mask)).abs().max() <= 1e-5


def test_wrappers_reproduce_the_model_forward(exported):
    import torch

    paths, _ = exported
    model, tokenizer = load_model(paths)
    assert isinstance(export.export_wrappers(model)[0], export.EncoderForExport)
    encoder, decoder = export.export_wrappers(model)
    ids, mask = (torch.from_numpy(a) for a in batch(tokenizer, ["A man is walking.", "Two dogs."]))
    dec_ids = torch.tensor([[model.config.decoder_start_token_id, 5, 6, 7]] * 2)
    with torch.no_grad():
        logits = decoder(dec_ids, encoder(ids, mask), mask)
        reference = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids).logits
    assert torch.equal(logits, reference)


# --------------------------------------------------------------------------------------------------- the gate


def test_a_perturbed_onnx_decoder_fails_the_gate_and_publishes_nothing(tiny_model_dir, tmp_path, monkeypatch):
    paths = make_root(tiny_model_dir, tmp_path)
    decode = export.OrtModel.decode

    def perturbed(self, *args):
        logits = decode(self, *args)
        return logits + np.random.default_rng(0).normal(0, 1e-2, logits.shape).astype(logits.dtype)

    monkeypatch.setattr(export.OrtModel, "decode", perturbed)
    with pytest.raises(ParityFailed, match=r"onnx decoder max abs diff .* > max_logit_diff 0\.0001"):
        export.run(export_params(torchscript=False, parity_sentences=4), paths)
    assert not paths.export.exists()
    assert not paths.metrics("export").exists()


def test_gate_names_every_figure_over_its_threshold():
    params = export_params(max_logit_diff=1e-4, min_identical=0.99)
    report = {
        "n_sentences": 10,
        "onnx": {"encoder_max_abs_diff": 1e-6, "decoder_max_abs_diff": 3e-3},
        "torchscript": {"encoder_max_abs_diff": float("nan"), "decoder_max_abs_diff": 0.0},
        "identical_share": 0.9,
        "emitted_pad": True,
    }
    failures = export.parity_failures(report, params)
    assert len(failures) == 4
    assert "onnx decoder max abs diff 0.003 > max_logit_diff 0.0001" in failures
    assert any(f.startswith("torchscript encoder max abs diff nan") for f in failures)
    assert any("90.00% of 10 sentences < min_identical 99.00%" in f for f in failures)
    assert "onnx greedy decoding emitted <pad>" in failures
    report.update(onnx={"encoder_max_abs_diff": 0.0, "decoder_max_abs_diff": 1e-4}, identical_share=0.99)
    report.update(torchscript={"encoder_max_abs_diff": 0.0, "decoder_max_abs_diff": 0.0}, emitted_pad=False)
    assert export.parity_failures(report, params) == []


class ScriptedRuntime:
    """A fake ONNX model whose decoder prefers, at step t, the token script[row][t]."""

    def __init__(self, script: list[list[int]], vocab: int = 6):
        self.script, self.vocab = script, vocab

    def encode(self, input_ids, attention_mask):
        return np.zeros((*input_ids.shape, 4), dtype=np.float32)

    def decode(self, decoder_input_ids, hidden, attention_mask):
        batch, length = decoder_input_ids.shape
        logits = np.zeros((batch, length, self.vocab), dtype=np.float32)
        logits[:, -1, 1] = 0.5  # token 1 is every step's second choice
        for row in range(batch):
            logits[row, -1, self.script[row][length - 1]] = 1.0
        return logits


def test_ort_greedy_stops_at_eos_never_emits_pad_and_forces_eos_at_the_limit():
    eos, pad = 0, 5
    # Row 0 ends early; row 1 "wants" <pad> at step 1 (it gets its next-best token, 1); row 2 never ends.
    runtime = ScriptedRuntime([[3, 0, 4, 4], [2, pad, 3, 0], [4, 4, 4, 4]])
    ids = np.ones((3, 2), dtype=np.int64)
    out = export.ort_greedy(runtime, ids, np.ones_like(ids), start_id=pad, eos_id=eos, pad_id=pad, max_new_tokens=4)
    assert out[0] == [3, 0]
    assert out[1] == [2, 1, 3, 0]
    assert out[2] == [4, 4, 4, 0]


# --------------------------------------------------------------------------------------------------- switches


def test_with_both_formats_off_the_export_dir_still_holds_tokenizer_config_and_manifest(tiny_model_dir, tmp_path):
    paths = make_root(tiny_model_dir, tmp_path)
    summary = export.run(export_params(onnx=False, torchscript=False), paths)
    names = {p.name for p in paths.export.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer_config.json", "export.json"} <= names
    assert not {n for n in names if n.endswith((".onnx", ".pt", ".safetensors"))}
    assert read_json(paths.export / "export.json")["files"] == {}
    assert summary == {"identical_share": None, "max_logit_diff": None, "bleu_delta": None}


def test_a_missing_final_model_names_the_train_stage(tmp_path):
    with pytest.raises(MissingArtifact, match=r"models/final not found: it is produced by the 'train' stage"):
        export.run(export_params(), Paths(tmp_path))


def test_importing_the_stage_does_not_import_torch_or_onnx():
    heavy = ["torch", "onnx", "onnxruntime", "transformers"]
    code = f"import json, sys, stages.export; print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
