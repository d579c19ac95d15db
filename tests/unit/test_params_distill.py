"""distill: off by default; student blocks of its own (tokenize, model, train, export); bad settings stop in the
schema or in check_params naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.params import ParamsError, parse, transformer_parameters
from pipeline.runtime.errors import PipelineError
from stages.check_params import check_teacher

SMALL_STUDENT = {"preset": "tiny", "d_model": 32, "ffn_dim": 64, "decoder_layers": 1}


def test_distillation_is_off_by_default_and_its_student_preset_has_one_decoder_layer_under_a_deeper_encoder():
    params = parse({})
    assert params.distill.enabled is False
    arch = params.distill.model.architecture()
    assert params.distill.model.preset == "student"
    assert arch["encoder_layers"] > arch["decoder_layers"] == 1


def test_a_partial_student_model_block_keeps_the_student_preset():
    params = parse({"distill": {"model": {"dropout": 0.0}}})
    assert params.distill.model.preset == "student" and params.distill.model.architecture()["dropout"] == 0.0


def test_the_student_view_swaps_in_the_distill_blocks_and_keeps_every_other_section():
    params = parse({"distill": {"enabled": True, "model": SMALL_STUDENT, "train": {"max_steps": 7},
                                "tokenize": {"vocab_size": 500}}, "evaluate": {"beam": 3}})
    student = params.student()
    assert student.model.architecture()["d_model"] == 32 and student.train.max_steps == 7
    assert student.tokenize.vocab_size == 500
    assert student.evaluate.beam == 3 and student.data == params.data and student.clean == params.clean
    assert params.model.preset == "tiny" and params.train.max_steps == 2400  # the teacher's own are untouched


def test_the_students_export_is_its_own_block_with_the_shortlist_on_unless_set():
    params = parse({"distill": {"enabled": True, "model": SMALL_STUDENT, "export": {"int8": False}}})
    student = params.student()
    assert student.export.shortlist is True and student.export.int8 is False
    assert params.export.shortlist is False and params.export.int8 is True  # the teacher's export is untouched
    assert parse({"distill": {"export": {"shortlist": False}}}).student().export.shortlist is False


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_a_ratio_outside_zero_to_one_names_the_key(ratio):
    with pytest.raises(ParamsError, match=r"distill\.original_ratio"):
        parse({"distill": {"original_ratio": ratio}})


def test_a_student_no_smaller_than_the_teacher_is_refused_naming_the_student_preset():
    with pytest.raises(ParamsError, match=r"distill\.model \(preset student.*not smaller than the teacher"):
        parse({"distill": {"enabled": True}})  # the student preset against the sample's tiny teacher
    parse({"distill": {"enabled": False}})  # switched off, nothing to compare
    parse({"distill": {"enabled": True, "model": SMALL_STUDENT}})


def test_the_size_estimate_counts_the_decoder_cross_attention_and_the_tied_embeddings():
    arch = {"d_model": 4, "ffn_dim": 8, "encoder_layers": 1, "decoder_layers": 1}
    assert transformer_parameters(arch, 10) == (4 * 16 + 2 * 32) + (8 * 16 + 2 * 32) + 10 * 4
    assert transformer_parameters(arch, 10, tie_embeddings=False) == transformer_parameters(arch, 10) + 40


def export_dir(root: Path, directions: list[str], d_model: int = 256) -> Path:
    """The files check_params reads of an export directory: export.json, languages.json, config.json."""
    root.mkdir()
    (root / "export.json").write_text("{}")
    (root / "languages.json").write_text(json.dumps({"directions": directions}))
    (root / "config.json").write_text(json.dumps({"d_model": d_model, "encoder_ffn_dim": 4 * d_model,
                                                  "encoder_layers": 3, "decoder_layers": 3, "vocab_size": 8000}))
    return root


def with_teacher(teacher: Path, **student) -> object:
    return parse({"data": {"directions": ["en-de", "de-en"]},
                  "distill": {"enabled": True, "teacher": str(teacher), **student}})


def test_a_teacher_that_cannot_translate_a_direction_stops_check_params_naming_it(tmp_path):
    teacher = export_dir(tmp_path / "teacher", ["en-de"])
    with pytest.raises(PipelineError, match=r"distill\.teacher .*teacher does not translate de-en"):
        check_teacher(with_teacher(teacher))


def test_a_teacher_directory_without_an_export_stops_check_params_naming_the_key(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineError, match=r"distill\.teacher .*empty: no export\.json"):
        check_teacher(with_teacher(tmp_path / "empty"))


def test_a_student_larger_than_an_external_teacher_stops_check_params(tmp_path):
    teacher = export_dir(tmp_path / "teacher", ["en-de", "de-en"], d_model=64)
    with pytest.raises(PipelineError, match=r"distill\.model \(preset student.*not smaller than distill\.teacher"):
        check_teacher(with_teacher(teacher))
    check_teacher(with_teacher(teacher, model=SMALL_STUDENT))


def test_the_teacher_is_this_runs_export_unless_another_directory_is_named(tmp_path):
    assert parse({}).distill.teacher == "models/export"
    assert parse({"distill": {"teacher": "./models/export"}}).distill.external_teacher is None
    assert parse({"distill": {"teacher": str(tmp_path)}}).distill.external_teacher == str(tmp_path)
    # dvc.yaml interpolates the path into distill's deps, where null has no meaning: refused naming the key.
    with pytest.raises(ParamsError, match=r"distill\.teacher"):
        parse({"distill": {"teacher": None}})
