"""The export stage: ONNX encoder + KV-cached decoder (and int8, legacy TorchScript, CTranslate2), a self-contained
export directory, and a parity gate that fails the stage.

One export of the sharpened tiny model (the session fixture `exported`, tests/e2e/conftest.py) serves most
assertions, and one of a two-target model (en-de and en-fr, sources tagged >>de<< / >>fr<<: `two_target_exported`)
the multi-direction ones; the gate-failure and switch cases run the stage again on their own roots, reusing the
ONNX graphs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifacts import Paths, read_json
from pipeline.errors import MissingArtifact, OptionalDependencyMissing, ParityFailed
from pipeline.params import ParamsError, parse
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.export_format import ExportManifest
from pipeline.runtime.languages import Directions
from pipeline.runtime.model_languages import ModelLanguages
from pipeline.runtime.translate import OnnxSeq2Seq
from stages import export
from stages.export import gate, onnx_graphs, quiet, stage_inputs, wrappers
from tests.conftest import write_pair_parquet
from tests.support.export_helpers import (
    CTRANSLATE2_INSTALLED,
    PARITY_SENTENCES,
    TWO_TARGETS,
    export_params,
    load_model,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
    pytest.mark.usefixtures("torch_on_one_thread"),
]

REPO = Path(__file__).resolve().parents[2]
ONNX_GRAPHS = ("encoder.onnx", "decoder.onnx", "encoder.int8.onnx", "decoder.int8.onnx")


def batch(tokenizer, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    enc = tokenizer(sentences, padding=True, return_tensors="np")
    return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)


def runtime(paths: Paths, int8: bool = False) -> OnnxSeq2Seq:
    suffix = ".int8.onnx" if int8 else ".onnx"
    return OnnxSeq2Seq(paths.export / f"encoder{suffix}", paths.export / f"decoder{suffix}")


def dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


# --------------------------------------------------------------------------------------------------- the graphs


def test_export_writes_onnx_int8_and_torchscript_graphs_that_pass_the_onnx_checker(exported):
    import onnx

    paths, _ = exported
    for name in (*ONNX_GRAPHS, "encoder.ts.pt", "decoder.ts.pt"):
        assert (paths.export / name).stat().st_size > 0, name
    for name in ONNX_GRAPHS:
        onnx.checker.check_model(str(paths.export / name))
        # external_data=False: the weights are inside the graph file, no `.onnx.data` beside it.
        assert not (paths.export / f"{name}.data").exists()
    sizes = read_json(paths.metrics("export"))
    assert sizes["onnx_int8"]["size_mb"]["decoder"] < sizes["onnx"]["size_mb"]["decoder"]


def test_the_graphs_carry_no_source_paths_so_the_same_model_exports_to_the_same_bytes_anywhere(exported):
    """torch's exporter attaches each node's Python stack trace, absolute file paths included; the stage drops it
    (and keeps the module scopes)."""
    import onnx

    paths, _ = exported
    for name in ONNX_GRAPHS:
        model = onnx.load(str(paths.export / name))
        keys = {prop.key for node in model.graph.node for prop in node.metadata_props}
        assert onnx_graphs.STACK_TRACE not in keys, name
        assert str(REPO) not in model.SerializeToString().decode("utf-8", "replace"), name
    scopes = {prop.key for node in onnx.load(str(paths.export / "decoder.onnx")).graph.node
              for prop in node.metadata_props}
    assert "pkg.torch.onnx.name_scopes" in scopes


def test_int8_graphs_run_every_weight_matmul_in_int8_the_output_projection_included(exported):
    import onnx

    paths, _ = exported
    vocab = read_json(paths.export / "config.json")["vocab_size"]
    for graph in ("encoder", "decoder"):
        model = onnx.load(str(paths.export / f"{graph}.int8.onnx")).graph
        weights = {init.name: tuple(init.dims) for init in model.initializer}
        ops = [node.op_type for node in model.node]
        # No fp32 MatMul reads a weight (what is left multiplies activations: attention), and nothing dequantises
        # a weight at run time, as a quantised embedding shared with the output projection would at every step.
        fp32_weight_matmuls = [n.name for n in model.node if n.op_type == "MatMul" and set(n.input) & set(weights)]
        assert fp32_weight_matmuls == [], graph
        assert "DequantizeLinear" not in ops, graph
        assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops or "MatMulIntegerToFloat" in ops
    # The decoder's output projection: an int8 (d_model, vocab) weight with a scale per vocabulary entry.
    decoder = onnx.load(str(paths.export / "decoder.int8.onnx")).graph
    shapes = {init.name: (tuple(init.dims), init.data_type) for init in decoder.initializer}
    projection = [name for name, (dims, dtype) in shapes.items() if dims[-1:] == (vocab,) and len(dims) == 2
                  and dtype == onnx.TensorProto.INT8]
    assert len(projection) == 1
    assert any(dims == (vocab,) and name.startswith(projection[0].removesuffix("_quantized"))
               for name, (dims, _) in shapes.items())



def test_the_decoder_takes_and_returns_a_kv_cache_and_every_batch_and_length_dim_is_symbolic(exported):
    import onnx

    paths, _ = exported
    encoder = onnx.load(str(paths.export / "encoder.onnx")).graph
    decoder = onnx.load(str(paths.export / "decoder.onnx")).graph
    # tiny preset: 2 decoder layers, 4 heads of 16 dims; caches one tensor per layer and kind.
    cross = ["cross_key_0", "cross_value_0", "cross_key_1", "cross_value_1"]
    assert [i.name for i in encoder.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in encoder.output] == ["last_hidden_state", *cross]
    assert [i.name for i in decoder.input] == [
        "decoder_input_ids", "encoder_attention_mask", "cache_rows",
        "self_key_0", "self_value_0", "self_key_1", "self_value_1", *cross,
    ]
    assert [o.name for o in decoder.output] == [
        "logits", "next_log_probs", "next_ids",
        "present_self_key_0", "present_self_value_0", "present_self_key_1", "present_self_value_1",
    ]
    inputs = {i.name: dims(i) for i in decoder.input}
    outputs = {o.name: dims(o) for o in decoder.output}
    # rows: hypotheses (sentences x beams); batch: sentences, which the cross cache is kept per; past_rows: the
    # hypotheses of the step before, which cache_rows picks from.
    assert inputs["decoder_input_ids"] == ["rows", "new_len"]
    assert inputs["encoder_attention_mask"] == ["batch", "src_len"]
    assert inputs["cache_rows"] == ["rows"]
    assert inputs["self_key_1"] == inputs["self_value_0"] == ["past_rows", 4, "past_len", 16]
    assert outputs["present_self_key_1"][0] == "rows"
    assert inputs["cross_key_0"] == inputs["cross_value_1"] == ["batch", 4, "src_len", 16]
    assert outputs["present_self_key_0"][2] in ("past_len + new_len", "new_len + past_len")
    # Candidates for the configured beam (evaluate.beam 4): 2 x 4 + 1.
    assert outputs["next_ids"] == outputs["next_log_probs"] == ["rows", 9]
    assert dims(encoder.input[0]) == ["batch", "src_len"]
    assert dims(encoder.output[1]) == ["batch", 4, "src_len", 16]


def expected_candidates(logits, count: int):
    """The best next tokens by log-softmax over the whole vocabulary (what transformers' beam search ranks)."""
    import torch

    return torch.topk(torch.log_softmax(torch.as_tensor(logits)[:, -1], dim=-1), count)


def test_the_cached_decoder_module_reproduces_the_model_forward_at_once_and_token_by_token(exported):
    import torch

    paths, _ = exported
    model, tokenizer = load_model(paths.final_model)
    encoder, decoder = wrappers.export_wrappers(model, beam=4)
    ids, mask = (torch.from_numpy(a) for a in batch(tokenizer, ["A man is walking.", "Two dogs."]))
    dec_ids = torch.tensor([[model.config.decoder_start_token_id, 5, 6, 7, 8]] * 2)
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids).logits
        hidden, *cross = encoder(ids, mask)
        assert torch.equal(hidden, model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state)
        rows = torch.arange(2)
        logits, next_log_probs, next_ids, *present = decoder(dec_ids, mask, rows, wrappers.empty_cache(model, 2),
                                                             cross)
        assert (logits - reference).abs().max() <= 1e-5
        assert [tuple(c.shape) for c in present] == [(2, 4, 5, 16)] * 4
        cache, steps = wrappers.empty_cache(model, 2), []
        for t in range(dec_ids.shape[1]):
            step_logits, _, _, *cache = decoder(dec_ids[:, t : t + 1], mask, rows, cache, cross)
            steps.append(step_logits)
    assert (torch.cat(steps, dim=1) - reference).abs().max() <= 1e-5
    expected = expected_candidates(reference, 9)
    assert torch.equal(next_ids, expected.indices)
    assert (next_log_probs - expected.values).abs().max() <= 1e-5


def test_onnx_graphs_accept_other_batch_sizes_beams_lengths_and_cache_lengths_than_the_export(exported):
    import torch

    paths, _ = exported
    model, tokenizer = load_model(paths.final_model)
    ort = runtime(paths)
    limit = export_params().export.max_logit_diff
    # The export example had 2 sentences x 3 beams, 2 new tokens after a cache of 3; try 3 and 1 sentences,
    # 1, 2 and 4 rows per sentence, caches of 0, 1 and 6 tokens and 1 or 7 new ones.
    rng = np.random.default_rng(0)
    for sentences, group, past_len, new_len in (
        (["A man.", "A woman in a red coat rides a bike down a long city street.", "Hello there"], 1, 0, 7),
        (["Only one sentence here, a bit longer than the others."], 4, 1, 1),
        (["Two short ones.", "Here."], 2, 6, 1),
    ):
        ids, mask = batch(tokenizer, sentences)
        rows = len(sentences) * group
        prefix = rng.integers(2, 900, size=(rows, past_len + new_len))
        prefix[:, 0] = model.config.decoder_start_token_id
        # PyTorch runs each hypothesis with its own copy of its sentence.
        with torch.no_grad():
            reference = model(input_ids=torch.from_numpy(ids).repeat_interleave(group, 0),
                              attention_mask=torch.from_numpy(mask).repeat_interleave(group, 0),
                              decoder_input_ids=torch.from_numpy(prefix)).logits.numpy()
        hidden, cross = ort.encode(ids, mask)
        cache = ort.empty_cache(rows)
        if past_len:
            cache = ort.decode(prefix[:, :past_len], mask, cache, cross).self_cache
        out = ort.decode(prefix[:, past_len:], mask, cache, cross)
        assert hidden.shape == (len(sentences), ids.shape[1], model.config.d_model)
        assert [c.shape for c in cross] == [(len(sentences), 4, ids.shape[1], 16)] * 4
        assert out.logits.shape == (rows, new_len, model.config.vocab_size)
        assert [c.shape for c in out.self_cache] == [(rows, 4, past_len + new_len, 16)] * 4
        assert np.abs(out.logits - reference[:, past_len:]).max() <= limit
        expected = expected_candidates(reference, 9)
        assert np.array_equal(out.next_ids, expected.indices.numpy())
        assert np.abs(out.next_log_probs - expected.values.numpy()).max() <= limit
        # Rows read the cache row cache_rows names: a shuffled cache, read back in order, gives the same step.
        if past_len:
            shuffle = rng.permutation(rows)
            shuffled = ort.decode(prefix[:, past_len:], mask, [c[shuffle] for c in cache], cross,
                                  cache_rows=np.argsort(shuffle))
            assert np.array_equal(shuffled.next_ids, out.next_ids)
            assert np.abs(shuffled.logits - out.logits).max() <= 1e-6
        # The search asks for the candidates and the cache only.
        search = ort.decode(prefix[:, past_len:], mask, cache, cross, logits=False)
        assert search.logits is None and np.array_equal(search.next_ids, out.next_ids)


def test_torchscript_graphs_are_the_legacy_uncached_ones_and_match_on_a_new_shape(exported):
    import torch

    paths, _ = exported
    model, tokenizer = load_model(paths.final_model)
    encoder, decoder = wrappers.legacy_wrappers(model)
    ts_encoder = torch.jit.load(str(paths.export / "encoder.ts.pt"))
    ts_decoder = torch.jit.load(str(paths.export / "decoder.ts.pt"))
    ids, mask = (torch.from_numpy(a) for a in batch(tokenizer, ["x", "A dog runs.", "Three people sit on a bench."]))
    dec_ids = torch.full((3, 5), model.config.decoder_start_token_id)
    with torch.no_grad():
        hidden = encoder(ids, mask)
        assert (ts_encoder(ids, mask) - hidden).abs().max() <= 1e-5
        assert (ts_decoder(dec_ids, hidden, mask) - decoder(dec_ids, hidden, mask)).abs().max() <= 1e-5
        reference = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids).logits
    assert torch.equal(decoder(dec_ids, hidden, mask), reference)


# --------------------------------------------------------------------------------------------------- the report


def test_metrics_report_parity_figures_under_the_thresholds_and_the_int8_bleu_delta(exported):
    paths, summary = exported
    params = export_params()
    metrics = read_json(paths.metrics("export"))
    assert metrics["n_sentences"] == PARITY_SENTENCES
    expected_diffs = {
        "onnx": {"encoder", "decoder", "decoder_cached", "end_to_end"},
        "torchscript": {"encoder", "decoder"},
    }
    for fmt, names in expected_diffs.items():
        assert {k.removesuffix("_max_abs_diff") for k in metrics[fmt] if k.endswith("_max_abs_diff")} == names
        for name in names:
            assert 0 <= metrics[fmt][f"{name}_max_abs_diff"] <= params.export.max_logit_diff
        for graph in ("encoder", "decoder"):
            assert metrics[fmt]["export_seconds"][graph] > 0
            assert metrics[fmt]["size_mb"][graph] > 0
    assert metrics["identical_share"] >= params.export.min_identical
    assert metrics["emitted_pad"] is False
    assert metrics["bleu"]["delta"] <= params.export.max_bleu_delta
    assert metrics["bleu"]["delta"] == round(abs(metrics["bleu"]["onnx"] - metrics["bleu"]["pytorch"]), 2)
    int8 = metrics["onnx_int8"]
    assert 0 <= int8["identical_share"] <= 1
    assert int8["bleu_delta"] == round(int8["bleu"] - metrics["bleu"]["pytorch"], 2)
    assert metrics["thresholds"] == {"max_logit_diff": 1e-4, "min_identical": 0.99, "max_bleu_delta": 0.1}
    # One direction: its report is the overall one (without the costs), from the test split.
    assert list(metrics["directions"]) == ["en-de"]
    en_de = metrics["directions"]["en-de"]
    assert en_de["split"] == "test" and en_de["n_sentences"] == PARITY_SENTENCES
    for key in ("identical_share", "emitted_pad", "bleu"):
        assert en_de[key] == metrics[key]
    assert en_de["onnx"] == {k: v for k, v in metrics["onnx"].items() if k.endswith("_max_abs_diff")}
    diffs = [v for f in expected_diffs for k, v in metrics[f].items() if k.endswith("_max_abs_diff")]
    assert summary == {
        "identical_share": metrics["identical_share"],
        "max_logit_diff": max(diffs),
        "bleu_delta": metrics["bleu"]["delta"],
        "int8_bleu_delta": int8["bleu_delta"],
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
    assert manifest["version"] == 7
    assert not {"family", "directions", "target_tags"} & set(manifest)  # the model's languages.json says
    languages = ModelLanguages.read(paths.export)
    assert (languages.family.name, languages.directions, languages.target_tags) == (
        "marian", Directions.of(["en-de"]), False)
    assert "languages.json" in manifest["model_files"]
    assert manifest["kv_cache"] is True
    assert manifest["files"]["onnx"] == {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
    assert manifest["files"]["onnx_int8"] == {"encoder": "encoder.int8.onnx", "decoder": "decoder.int8.onnx"}
    assert manifest["files"]["torchscript"] == {"encoder": "encoder.ts.pt", "decoder": "decoder.ts.pt"}
    assert manifest["inputs"]["onnx"]["decoder"][2:5] == ["cache_rows", "self_key_0", "self_value_0"]
    assert manifest["next_token_candidates"] == 9
    assert manifest["opset"] == export_params().export.opset
    assert manifest["vocab_size"] == config.vocab_size == len(tokenizer)
    # Marian layout: </s> = 0, <pad> = last id, decoding starts from <pad>.
    assert manifest["eos_id"] == 0
    assert manifest["pad_id"] == manifest["decoder_start_id"] == config.vocab_size - 1
    assert manifest["dims"]["d_model"] == config.d_model
    defaults = parse({}).evaluate
    assert manifest["generation"] == {"beam": defaults.beam, "length_penalty": defaults.length_penalty,
                                      "max_len_a": defaults.max_len_a, "max_len_b": defaults.max_len_b}
    # One generation block: the length rule is not written twice.
    assert "max_len" not in manifest
    assert ExportManifest.read(paths.export).to_json() == manifest
    for name in manifest["model_files"]:
        assert (paths.export / name).is_file()


@pytest.mark.skipif(not CTRANSLATE2_INSTALLED, reason="ctranslate2 is not installed (the `ct2` extra)")
def test_ctranslate2_conversion_is_written_and_its_agreement_reported(exported):
    import ctranslate2

    paths, _ = exported
    metrics = read_json(paths.metrics("export"))["ctranslate2"]
    assert (paths.export / "ctranslate2" / "model.bin").is_file()
    assert metrics["quantization"] == "int8" and metrics["size_mb"] > 0
    assert 0 <= metrics["identical_share"] <= 1 and "bleu_delta" in metrics
    translator = ctranslate2.Translator(str(paths.export / "ctranslate2"), device="cpu")
    result = translator.translate_batch([["▁A", "▁dog", "</s>"]], beam_size=1, max_decoding_length=5)
    assert "<pad>" not in result[0].hypotheses[0]


# --------------------------------------------------------------------------------------------------- the gate


def reuse_onnx_graphs(exported_dir: Path):
    """An export_onnx that copies the shared export's graphs: the gate tests are about the gate, not the export."""

    def copy_graphs(model, example, out, opset, beam, shortlist=False, int8=False):
        assert not shortlist, "the shared export has no shortlisted decoder to copy"
        for name in ("encoder.onnx", "decoder.onnx"):
            shutil.copy2(exported_dir / name, out / name)
        return {"encoder": 0.01, "decoder": 0.01}

    return copy_graphs


def test_a_perturbed_onnx_decoder_fails_the_gate_and_publishes_nothing(exported, make_sharpened_root, monkeypatch):
    paths = make_sharpened_root()
    monkeypatch.setattr(onnx_graphs, "export_onnx", reuse_onnx_graphs(exported[0].export))
    decode = OnnxSeq2Seq.decode

    def perturbed(self, *args, **kwargs):
        out = decode(self, *args, **kwargs)
        if out.logits is None:  # the search's steps: only the logits are perturbed
            return out
        noise = np.random.default_rng(0).normal(0, 1e-2, out.logits.shape).astype(out.logits.dtype)
        return dataclasses.replace(out, logits=out.logits + noise)

    monkeypatch.setattr(OnnxSeq2Seq, "decode", perturbed)
    with pytest.raises(ParityFailed,
                       match=r"en-de: onnx decoder max abs diff .* > export\.max_logit_diff 0\.0001") as failure:
        export.run(export_params(int8=False, torchscript=False, parity_sentences=4), paths)
    assert "onnx decoder cached max abs diff" in str(failure.value)
    assert not paths.export.exists()
    assert not paths.metrics("export").exists()


def test_gate_names_every_figure_over_its_threshold():
    params = export_params(max_logit_diff=1e-4, min_identical=0.99, max_bleu_delta=0.1)
    report = {
        "n_sentences": 10,
        "onnx": {"encoder_max_abs_diff": 1e-6, "decoder_max_abs_diff": 3e-3, "decoder_cached_max_abs_diff": 2e-4,
                 "end_to_end_max_abs_diff": 5e-5, "export_seconds": {"encoder": 99.0}},
        "torchscript": {"encoder_max_abs_diff": float("nan"), "decoder_max_abs_diff": 0.0},
        "identical_share": 0.9,
        "emitted_pad": True,
        "bleu": {"pytorch": 20.0, "onnx": 19.5, "delta": 0.5},
        # int8 and CTranslate2 are reported, never gated.
        "onnx_int8": {"identical_share": 0.1, "bleu": 2.0, "bleu_delta": -18.0},
    }
    failures = gate.parity_failures(report, params.export)
    assert len(failures) == 6, failures
    assert "onnx decoder max abs diff 0.003 > export.max_logit_diff 0.0001" in failures
    assert "onnx decoder cached max abs diff 0.0002 > export.max_logit_diff 0.0001" in failures
    assert any(f.startswith("torchscript encoder max abs diff nan") for f in failures)
    assert any("90.00% of 10 sentences < export.min_identical 99.00%" in f for f in failures)
    assert "onnx greedy BLEU differs from PyTorch by 0.50 > export.max_bleu_delta 0.10" in failures
    assert "onnx greedy decoding emitted <pad>" in failures
    report["onnx"].update(decoder_max_abs_diff=1e-4, decoder_cached_max_abs_diff=0.0)
    report.update(torchscript={"encoder_max_abs_diff": 0.0, "decoder_max_abs_diff": 0.0}, emitted_pad=False,
                  identical_share=0.99, bleu={"pytorch": 20.0, "onnx": 19.9, "delta": 0.1})
    assert gate.parity_failures(report, params.export) == []


def test_the_gate_names_the_direction_of_each_failure():
    params = export_params()
    passing = {"n_sentences": 4, "onnx": {"encoder_max_abs_diff": 1e-6}, "identical_share": 1.0,
               "emitted_pad": False, "bleu": {"pytorch": 1.0, "onnx": 1.0, "delta": 0.0}}
    failing = {**passing, "onnx": {"encoder_max_abs_diff": 0.5}, "identical_share": 0.5}
    report = {**passing, "directions": {"en-de": passing, "en-fr": failing}}
    assert gate.direction_failures(report, params.export) == [
        "en-fr: onnx encoder max abs diff 0.5 > export.max_logit_diff 0.0001",
        "en-fr: onnx greedy outputs identical to PyTorch for 50.00% of 4 sentences < export.min_identical 99.00%",
    ]
    report["directions"]["en-fr"] = passing
    assert gate.direction_failures(report, params.export) == []


# --------------------------------------------------------------------------------------------------- directions


def test_a_two_target_export_records_its_directions_and_its_tokenizer_keeps_each_tag_whole(two_target_exported):
    from transformers import AutoTokenizer

    paths = two_target_exported
    manifest = ExportManifest.read(paths.export)
    languages = ModelLanguages.read(paths.export)
    assert (languages.directions, languages.target_tags) == (Directions.of(TWO_TARGETS), True)
    assert "languages.json" in manifest.model_files
    tokenizer = AutoTokenizer.from_pretrained(paths.export)
    for tag in (">>de<<", ">>fr<<"):
        ids = tokenizer(f"{tag} A dog runs.")["input_ids"]
        assert ids[0] == tokenizer.convert_tokens_to_ids(tag) != tokenizer.unk_token_id
        assert ids[1:] == tokenizer("A dog runs.")["input_ids"]


def test_parity_is_checked_and_reported_for_every_direction_on_its_own_tagged_sentences(two_target_exported):
    paths = two_target_exported
    thresholds = export_params().export
    metrics = read_json(paths.metrics("export"))
    per_direction = metrics["directions"]
    assert list(per_direction) == list(TWO_TARGETS)
    for report in per_direction.values():
        assert report["split"] == "test" and report["n_sentences"] == PARITY_SENTENCES
        assert all(0 <= v <= thresholds.max_logit_diff for v in report["onnx"].values())
        assert report["identical_share"] >= thresholds.min_identical and report["emitted_pad"] is False
        assert report["bleu"]["delta"] <= thresholds.max_bleu_delta
    # Overall: every direction's sentences pooled, the largest difference of any direction.
    assert metrics["n_sentences"] == 2 * PARITY_SENTENCES
    for name, value in metrics["onnx"].items():
        if name.endswith("_max_abs_diff"):
            assert value == max(r["onnx"][name] for r in per_direction.values())
    assert ExportManifest.read(paths.export).parity["directions"] == per_direction


@pytest.mark.skipif(not CTRANSLATE2_INSTALLED, reason="ctranslate2 is not installed (the `ct2` extra)")
def test_ctranslate2_converts_the_tags_as_tokens_and_decodes_tagged_sources_as_pytorch_does(two_target_exported):
    import ctranslate2

    paths = two_target_exported
    vocabulary = json.loads((paths.export / "ctranslate2" / "shared_vocabulary.json").read_text())
    assert {">>de<<", ">>fr<<"} <= set(vocabulary)
    # Converted in float32: greedy outputs on each direction's tagged sources are PyTorch's.
    for report in read_json(paths.metrics("export"))["directions"].values():
        assert report["ctranslate2"]["identical_share"] == 1.0
    translator = ctranslate2.Translator(str(paths.export / "ctranslate2"), device="cpu")
    result = translator.translate_batch([[">>fr<<", "▁A", "▁dog", "</s>"]], beam_size=1, max_decoding_length=5)
    assert "<pad>" not in result[0].hypotheses[0]


def perturb_encoder_for(tag_id: int):
    """OnnxSeq2Seq.encode with noise on the states of sentences that start with `tag_id`."""
    encode = OnnxSeq2Seq.encode

    def perturbed(self, input_ids, attention_mask):
        hidden, cross = encode(self, input_ids, attention_mask)
        rows = input_ids[:, 0] == tag_id
        hidden = hidden.copy()
        hidden[rows] += np.random.default_rng(0).normal(0, 1e-2, hidden[rows].shape).astype(hidden.dtype)
        return hidden, cross

    return perturbed


def test_a_direction_that_breaks_parity_fails_the_gate_naming_that_direction_only(two_target_exported,
                                                                                   make_two_target_root,
                                                                                   monkeypatch):
    from transformers import AutoTokenizer

    paths = make_two_target_root()
    monkeypatch.setattr(onnx_graphs, "export_onnx", reuse_onnx_graphs(two_target_exported.export))
    fr_tag = AutoTokenizer.from_pretrained(paths.final_model).convert_tokens_to_ids(">>fr<<")
    monkeypatch.setattr(OnnxSeq2Seq, "encode", perturb_encoder_for(fr_tag))
    settings = {"int8": False, "torchscript": False, "ctranslate2": False, "parity_sentences": 4}
    with pytest.raises(ParityFailed, match=r"parity gate failed: en-fr: onnx encoder max abs diff") as failure:
        export.run(export_params(**settings), paths)
    assert "en-de" not in str(failure.value)
    assert not paths.export.exists()


def test_a_direction_no_test_split_holds_is_checked_on_its_valid_pairs(make_two_target_root):
    from transformers import AutoTokenizer

    paths = make_two_target_root()
    tokenizer = AutoTokenizer.from_pretrained(paths.final_model)
    languages = ModelLanguages.read(paths.final_model)
    write_pair_parquet(paths.split_file(paths.clean, "test"), [("A dog.", "Ein Hund.")] * 3, "test.en", "en-de")
    pairs = stage_inputs.parity_pairs(paths, languages, 2, tokenizer, 512)
    assert {name: (p.split, len(p.sources)) for name, p in pairs.items()} == {"en-de": ("test", 2),
                                                                              "en-fr": ("valid", 2)}
    assert pairs["en-de"].references == ["Ein Hund.", "Ein Hund."]
    # Sources are read as the model reads them: the target's tag first.
    assert pairs["en-fr"].sources[0][0] == tokenizer.convert_tokens_to_ids(">>fr<<")
    assert pairs["en-de"].sources[0] == tokenizer(">>de<< A dog.")["input_ids"]

    write_pair_parquet(paths.split_file(paths.clean, "valid"), [("A dog.", "Ein Hund.")], "val.en", "en-de")
    with pytest.raises(ParityFailed, match=r"no pairs of en-fr in .*data/clean \(test splits: test; nor in valid\)"):
        stage_inputs.parity_pairs(paths, languages, 2, tokenizer, 512)


def test_a_model_without_its_languages_is_refused_naming_the_file(tmp_path):
    # (A languages file without layouts, or of another family: tests/e2e/test_export_checkpoint_families.py.)
    (tmp_path / "models" / "final").mkdir(parents=True)
    (tmp_path / "models" / "final" / "config.json").write_text('{"model_type": "marian"}')
    with pytest.raises(PipelineError, match=r"final/languages\.json: not found .*rerun the pipeline from tokenize"):
        export.run(parse({}), Paths(tmp_path))


# --------------------------------------------------------------------------------------------------- switches


def test_with_every_format_off_the_export_dir_still_holds_tokenizer_config_and_manifest(make_sharpened_root):
    paths = make_sharpened_root()
    summary = export.run(export_params(onnx=False, int8=False, torchscript=False), paths)
    names = {p.name for p in paths.export.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer_config.json", "export.json"} <= names
    assert not {n for n in names if n.endswith((".onnx", ".pt", ".safetensors"))}
    manifest = read_json(paths.export / "export.json")
    assert manifest["files"] == {} and manifest["kv_cache"] is False
    assert summary == {"identical_share": None, "max_logit_diff": None, "bleu_delta": None, "int8_bleu_delta": None}


def test_int8_without_onnx_is_a_params_error():
    with pytest.raises(ParamsError, match="int8 quantises the ONNX graphs: it needs onnx: true"):
        parse({"export": {"onnx": False, "int8": True}})


def test_ctranslate2_requested_without_the_package_names_the_extra_before_any_work(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else
                        find_spec(name, *a))
    with pytest.raises(OptionalDependencyMissing, match=r"pip install 'mtpipe\[ct2\]'"):
        export.run(export_params(ctranslate2=True), Paths(tmp_path))


def test_a_missing_final_model_names_the_train_stage(tmp_path):
    with pytest.raises(MissingArtifact, match=r"models/final not found: it is produced by the 'train' stage"):
        export.run(export_params(), Paths(tmp_path))


def test_importing_the_stage_does_not_import_torch_or_onnx():
    heavy = ["torch", "onnx", "onnxruntime", "transformers"]
    code = f"import json, sys, stages.export; print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


# --------------------------------------------------------------------------------------------------- quiet


def test_quieting_the_quantizer_drops_its_root_logger_records_and_nothing_else(caplog):
    import logging

    import onnxruntime.quantization

    root = logging.getLogger()
    quantizer_file = str(Path(onnxruntime.quantization.__file__).parent / "quant_utils.py")

    def quantizer_says(level: int, message: str) -> None:
        # What its module-level `logging.warning(...)` calls produce: a record on the root logger from its file.
        root.handle(root.makeRecord("root", level, quantizer_file, 1, message, (), None))

    filters_before = list(root.filters)
    with caplog.at_level(logging.INFO):
        with quiet.quiet_quantizer():
            quantizer_says(logging.WARNING, "Please consider to run pre-processing")
            quantizer_says(logging.ERROR, "a real quantiser error")
            logging.warning("the stage's own root-logger warning")
            logging.getLogger("mtpipe.export").info("the stage's progress")
        quantizer_says(logging.WARNING, "after the block")
    assert [r.getMessage() for r in caplog.records] == [
        "a real quantiser error", "the stage's own root-logger warning", "the stage's progress", "after the block",
    ]
    assert root.filters == filters_before
    assert logging.root.manager.disable == logging.NOTSET


def test_quieting_the_exporters_sets_their_loggers_to_error_and_restores_each_level():
    import logging

    names = quiet.ONNX_EXPORTER_LOGGERS
    before = {name: logging.getLogger(name).level for name in names}
    logging.getLogger(names[0]).setLevel(logging.DEBUG)
    try:
        with quiet.quiet_exporters():
            assert [logging.getLogger(name).level for name in names] == [logging.ERROR] * len(names)
            assert logging.getLogger("mtpipe.export").level == logging.NOTSET
        assert logging.getLogger(names[0]).level == logging.DEBUG
        assert [logging.getLogger(name).level for name in names[1:]] == [before[name] for name in names[1:]]
    finally:
        logging.getLogger(names[0]).setLevel(before[names[0]])
