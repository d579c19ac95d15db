"""The params files in configs/: each one loads through pipeline.params (the check every stage runs first), and the
GPU examples keep the recipes their comments describe."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.params import PRESETS, Params, load

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
BASE_GPU = REPO / "configs" / "wmt14-base-gpu.yaml"
BIG_GPU = REPO / "configs" / "wmt14-big-gpu.yaml"
# What the pipeline prepares before training: equal in both GPU files, so DVC reuses one file's corpus for the other.
DATA_SECTIONS = ("data", "clean", "validate", "tokenize")


def raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def tokens_per_update(path: Path) -> int:
    train = load(path).train
    assert train.nproc == 1, "the GPU examples are for one GPU"
    return train.max_tokens * train.update_freq


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_is_a_valid_params_file(path):
    load(path)


@pytest.mark.parametrize("path", [BASE_GPU, BIG_GPU], ids=lambda p: p.name)
def test_the_gpu_configs_are_complete_wmt14_en_de_runs_in_bf16_without_a_time_cap(path):
    sections = {field.alias or name for name, field in Params.model_fields.items()}
    assert set(raw(path)) == sections
    params = load(path)
    assert (params.data.source, params.data.directions.names) == ("wmt14", ["en-de"])
    assert params.data.max_train_pairs is None
    assert (params.tokenize.vocab_size, params.tokenize.joint, params.model.tie_embeddings) == (32000, True, True)
    assert params.train.precision == "bf16" and params.train.max_minutes is None
    assert params.train.max_steps % params.train.save_every == 0, "the last update is a checkpoint to average"
    assert params.train.average_last > 1


def test_the_gpu_configs_share_the_sections_that_prepare_the_corpus():
    base, big = raw(BASE_GPU), raw(BIG_GPU)
    assert {s: base[s] for s in DATA_SECTIONS} == {s: big[s] for s in DATA_SECTIONS}


def test_the_base_gpu_config_is_vaswani_base_with_about_25k_target_tokens_per_update():
    params = load(BASE_GPU)
    assert params.model.preset == "base" and params.model.architecture() == PRESETS["base"]
    # Padded tokens of the longer side: a little above the paper's ~25k target tokens per batch.
    assert 25_000 <= tokens_per_update(BASE_GPU) <= 40_000
    # The peak of Vaswani et al.'s schedule, d_model^-0.5 * warmup^-0.5.
    assert params.train.lr == pytest.approx((512 * params.train.warmup_steps) ** -0.5, rel=0.01)
    assert (params.train.max_steps, params.train.warmup_steps) == (100_000, 4000)


def test_the_big_gpu_config_updates_with_the_batch_of_fairseqs_scaling_nmt_recipe():
    params = load(BIG_GPU)
    assert params.model.preset == "big" and params.model.architecture() == PRESETS["big"]
    assert tokens_per_update(BIG_GPU) == 3584 * 128  # --max-tokens 3584 on 8 GPUs x --update-freq 16
    assert (params.train.lr, params.train.warmup_steps) == (1e-3, 4000)


MULTI30K = REPO / "configs" / "multi30k-cpu-ref.yaml"
MULTI30K_MULTI = REPO / "configs" / "multi30k-multi-cpu-ref.yaml"


def test_the_multi30k_configs_are_bounded_by_their_own_step_budgets_not_a_clock_in_auto_precision():
    bilingual, multilingual = load(MULTI30K), load(MULTI30K_MULTI)
    for params in (bilingual, multilingual):
        assert params.train.max_minutes is None and params.train.max_epochs is None
        assert params.train.precision == "auto"
        assert params.train.max_steps % params.train.save_every == 0, "the last update is a checkpoint to average"
        assert "val" in params.data.files, "val, what the settings were chosen on, is scored beside the test set"
    # One budget, 30 minutes, in each config's own updates: the same model with a vocabulary twice as large (and
    # three directions validated) makes every multilingual update dearer (1.27x, bench/README.md), so fewer of them.
    assert multilingual.tokenize.vocab_size > bilingual.tokenize.vocab_size
    assert multilingual.train.max_steps < bilingual.train.max_steps


def test_the_multilingual_config_changes_only_the_data_and_what_several_directions_need():
    bilingual, multilingual = raw(MULTI30K), raw(MULTI30K_MULTI)
    # Dropout is chosen on each config's val: with three directions each pair is seen a half to a quarter as often.
    assert {k: v for k, v in multilingual["model"].items() if k != "dropout"} == \
        {k: v for k, v in bilingual["model"].items() if k != "dropout"}
    per_direction = {"valid_bleu_sentences", "direction_weights"}  # logged per direction; one direction is not sampled
    # Checkpoints averaged: each config's val decides (they cost disk, not time). lr: the bilingual config's was
    # re-chosen on its val at 0.0015; the multilingual keeps the 0.002 its figures were measured at.
    # max_steps: each config's 30 minutes (the test above).
    own_val = {"average_last", "lr", "max_steps"}
    assert {k: v for k, v in multilingual["train"].items() if k not in per_direction | own_val} == \
        {k: v for k, v in bilingual["train"].items() if k not in per_direction | own_val}
    assert multilingual["train"]["average_last"] > 1 and bilingual["train"]["average_last"] > 1


MULTI30K_DISTILL = REPO / "configs" / "multi30k-distill-cpu.yaml"


def test_the_distill_config_is_the_multi30k_teacher_with_distillation_switched_on():
    teacher, distilled = raw(MULTI30K), raw(MULTI30K_DISTILL)
    assert distilled["distill"].pop("enabled") is True and teacher["distill"].pop("enabled") is False
    assert distilled == teacher, "one teacher: the distilled run reuses every teacher stage of the Multi30k run"


def test_the_multi30k_student_is_smaller_trains_like_the_teacher_and_is_bounded_by_steps():
    params = load(MULTI30K_DISTILL)
    student, teacher = params.distill, params
    assert student.model.preset == "student" and student.model.init == "scratch"
    arch = student.model.architecture()
    assert arch["decoder_layers"] <= 2 < arch["encoder_layers"], "deep encoder, shallow decoder"
    assert student.train.max_minutes is None and student.train.max_steps % student.train.save_every == 0
    # average_last: its own val's; lr: the teacher's was re-chosen on its val, the student's is the one it was
    # measured at
    same = {"warmup_steps", "lr_schedule", "label_smoothing", "max_tokens", "precision"}
    assert {k: getattr(student.train, k) for k in same} == {k: getattr(teacher.train, k) for k in same}
    assert student.tokenize.vocab_size < teacher.tokenize.vocab_size
    # The student decodes with a lexical shortlist; the teacher's export, its own block, keeps the whole vocabulary.
    assert student.export.shortlist and not teacher.export.shortlist
    assert student.export.model_dump(exclude={"shortlist"}) == teacher.export.model_dump(exclude={"shortlist"})
