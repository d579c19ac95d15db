"""pipeline/runtime/export_format.py: the manifest `export.json` round-trips (with the model's family and directions),
and a missing, mistyped or old one is refused with an error naming the file and the field."""

from __future__ import annotations

import dataclasses
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
        family="marian",
        directions=("en-de",),
        target_tags=False,
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
    assert data["version"] == MANIFEST_VERSION == 6
    assert data["family"] == "marian"
    assert (data["directions"], data["target_tags"]) == (["en-de"], False)
    assert data["generation"] == {"beam": 4, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 10}
    assert "max_len" not in data
    assert (data["pad_id"], data["eos_id"], data["decoder_start_id"]) == (999, 0, 999)
    assert data["bad_words_ids"] == [[999]]
    assert data["inputs"]["onnx"]["decoder"] == decoder_inputs(2)
    assert data["outputs"]["onnx"] == {"encoder": encoder_outputs(2), "decoder": decoder_outputs(2)}


def test_a_two_target_manifest_reads_back_its_directions_and_tags(tmp_path):
    two = dataclasses.replace(manifest(), directions=("en-de", "en-fr"), target_tags=True)
    two.write(tmp_path)
    read = ExportManifest.read(tmp_path)
    assert read == two
    assert read.pairs.targets == ["de", "fr"] and read.pairs.tags == [">>de<<", ">>fr<<"]


@pytest.mark.parametrize(("directions", "expected"), [
    (["en_de"], "field 'directions' is ['en_de']: 'en_de' is not a direction"),
    ([], "field 'directions' is [], not a list of distinct directions"),
    (["en-de", "en-de"], "field 'directions' is ['en-de', 'en-de'], not a list of distinct directions"),
])
def test_directions_that_are_no_directions_are_refused(tmp_path, directions, expected):
    write_edited(tmp_path, lambda data: data.update(directions=directions))
    with pytest.raises(ExportDirError, match=re.escape(f"{tmp_path / MANIFEST}: {expected}")):
        ExportManifest.read(tmp_path)


def test_target_tags_are_refused_for_a_family_other_than_marian(tmp_path):
    write_edited(tmp_path, lambda data: data.update(family="mbart50", directions=["en-de", "en-fr"],
                                                    target_tags=True))
    expected = f"{tmp_path / MANIFEST}: field 'target_tags' is true for a mbart50 model"
    with pytest.raises(ExportDirError, match=re.escape(expected)):
        ExportManifest.read(tmp_path)


def test_an_unknown_family_is_refused_naming_the_families(tmp_path):
    write_edited(tmp_path, lambda data: data.update(family="t5"))
    expected = f"{tmp_path / MANIFEST}: field 'family' is 't5', not one of marian, mbart, mbart50, m2m100, nllb"
    with pytest.raises(ExportDirError, match=re.escape(expected)):
        ExportManifest.read(tmp_path)


def test_the_onnx_graphs_are_looked_up_by_precision():
    assert manifest().onnx_graphs() == {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
    assert manifest().onnx_graphs(int8=True) is None


def test_an_older_version_is_refused_with_export_it_again(tmp_path):
    write_edited(tmp_path, lambda data: data.update(version=5))
    with pytest.raises(ExportDirError, match=r"export\.json is export format version 5, this code reads version 6: "
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
    ("directions", "en-de", "a list"),
    ("target_tags", "no", "true or false"),
    ("family", 3, "a string"),
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
