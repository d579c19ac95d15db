"""pipeline/runtime/export_format.py: the manifest `export.json` round-trips, and a missing, mistyped or old one is
refused with an error naming the file and the field. (The model's languages are its languages.json's:
test_model_languages.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.export_format import (
    MANIFEST,
    MANIFEST_VERSION,
    ExportDirError,
    ExportManifest,
    Generation,
    ModelDims,
    candidates_for_beam,
    decoder_inputs,
    decoder_outputs,
    encoder_outputs,
)


def manifest() -> ExportManifest:
    return ExportManifest(
        files={"onnx": {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}},
        model_files=("config.json", "vocab.json"),
        opset=18,
        kv_cache=True,
        next_token_candidates=candidates_for_beam(4),
        vocab_size=1000,
        special_ids=SpecialIds(start=999, eos=0, pad=999),
        dims=ModelDims(d_model=64, encoder_layers=2, decoder_layers=2, attention_heads=4, max_positions=128),
        generation=Generation(beam=4, length_penalty=1.0, max_len_a=1.2, max_len_b=10),
        parity={"n_sentences": 32},
    )


def write_edited(directory: Path, edit) -> Path:
    data = manifest().to_json()
    edit(data)
    (directory / MANIFEST).write_text(json.dumps(data), encoding="utf-8")
    return directory


def test_a_written_manifest_reads_back_equal_with_one_generation_block(tmp_path):
    manifest().write(tmp_path)
    assert ExportManifest.read(tmp_path) == manifest()
    data = json.loads((tmp_path / MANIFEST).read_text())
    assert data["version"] == MANIFEST_VERSION == 7
    assert not {"family", "directions", "target_tags"} & set(data)  # languages.json's, not a copy here
    assert data["generation"] == {"beam": 4, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 10}
    assert "max_len" not in data
    assert (data["pad_id"], data["eos_id"], data["decoder_start_id"]) == (999, 0, 999)
    assert data["bad_words_ids"] == [[999]]
    assert data["inputs"]["onnx"]["decoder"] == decoder_inputs(2)
    assert data["outputs"]["onnx"] == {"encoder": encoder_outputs(2), "decoder": decoder_outputs(2)}


def test_the_onnx_graphs_are_looked_up_by_precision():
    assert manifest().onnx_graphs() == {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
    assert manifest().onnx_graphs(int8=True) is None


def test_an_older_version_is_refused_with_export_it_again(tmp_path):
    write_edited(tmp_path, lambda data: data.update(version=6))
    with pytest.raises(ExportDirError, match=r"export\.json is export format version 6, this code reads version 7: "
                                             r"export it again \(`dvc repro export`\)"):
        ExportManifest.read(tmp_path)


def test_a_missing_field_is_named_with_the_file(tmp_path):
    write_edited(tmp_path, lambda data: data["generation"].pop("max_len_b"))
    expected = f"{tmp_path / MANIFEST}: field 'generation.max_len_b' is missing"
    with pytest.raises(ExportDirError, match=re.escape(expected)):
        ExportManifest.read(tmp_path)


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("generation.beam", "4", "an integer"),
    ("generation.beam", True, "an integer"),
    ("kv_cache", 1, "true or false"),
    ("dims.max_positions", 12.5, "an integer"),
    ("files", [], "an object"),
])
def test_a_field_of_the_wrong_type_is_named_with_its_value(tmp_path, field, value, expected):
    def edit(data):
        *parents, name = field.split(".")
        node = data
        for parent in parents:
            node = node[parent]
        node[name] = value

    write_edited(tmp_path, edit)
    with pytest.raises(ExportDirError, match=re.escape(f"field '{field}' is {value!r}, not {expected}")):
        ExportManifest.read(tmp_path)


def test_an_integer_passes_for_a_number_and_null_for_an_optional_field(tmp_path):
    def edit(data):
        data["generation"]["length_penalty"] = 1
        data["opset"] = None
        data["decoder_start_id"] = None

    write_edited(tmp_path, edit)
    read = ExportManifest.read(tmp_path)
    assert read.generation.length_penalty == 1.0 and isinstance(read.generation.length_penalty, float)
    assert read.opset is None
    assert read.special_ids.start is None


def test_a_missing_or_broken_manifest_names_the_file(tmp_path):
    with pytest.raises(ExportDirError, match=r"export\.json not found: is .* an export directory"):
        ExportManifest.read(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json", encoding="utf-8")
    with pytest.raises(ExportDirError, match=r"export\.json: not valid JSON"):
        ExportManifest.read(tmp_path)
