"""train.lr_schedule: the factor of train.lr each update gets, what params accept with it, and what a resume must
match when the schedule ends at max_steps."""

from __future__ import annotations

import math

import pytest

from pipeline.params import parse
from stages.train.checkpoint import fingerprint
from stages.train.schedule import lr_factor


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "linear", "cosine"])
def test_every_schedule_warms_up_linearly_to_the_base_rate(schedule):
    assert [lr_factor(schedule, s, 4, 100) for s in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]


def test_inverse_sqrt_decays_with_one_over_the_root_of_the_step_and_ignores_max_steps():
    assert lr_factor("inverse_sqrt", 400, 100, 10) == pytest.approx(0.5)
    assert lr_factor("inverse_sqrt", 400, 100, 10**6) == lr_factor("inverse_sqrt", 400, 100, 10)
    assert lr_factor("inverse_sqrt", 7, 0, 10) == 1.0


def test_linear_falls_in_a_straight_line_to_zero_at_max_steps():
    factors = [lr_factor("linear", s, 100, 1100) for s in (100, 350, 600, 850, 1100)]
    assert factors == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert lr_factor("linear", 1200, 100, 1100) == 0.0  # never negative past the end


def test_cosine_is_half_a_cosine_from_one_to_zero():
    assert lr_factor("cosine", 600, 100, 1100) == pytest.approx(0.5)
    assert lr_factor("cosine", 350, 100, 1100) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_factor("cosine", 1100, 100, 1100) == pytest.approx(0.0)


def test_a_schedule_without_warmup_starts_at_the_base_rate():
    assert lr_factor("linear", 1, 0, 100) == pytest.approx(0.99)


@pytest.mark.parametrize("limit", [{"max_minutes": 30}, {"max_epochs": 3}])
def test_a_decaying_schedule_with_a_limit_that_may_stop_it_early_is_refused_naming_both(limit):
    with pytest.raises(ValueError, match=rf"train\.lr_schedule linear .* train\.{next(iter(limit))}"):
        parse({"train": {"lr_schedule": "linear", **limit}})
    parse({"train": {"lr_schedule": "inverse_sqrt", **limit}})  # open-ended: any limit is fine


def test_an_unknown_schedule_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"train\.lr_schedule"):
        parse({"train": {"lr_schedule": "step"}})


def digest(tmp_path, **train):
    spec = {"model": {}, "train": parse({"train": train}).train.model_dump()}
    return fingerprint(spec, 1, tmp_path)["digest"]


def test_a_decaying_run_resumes_only_with_the_max_steps_it_decays_to(tmp_path):
    assert digest(tmp_path, lr_schedule="linear", max_steps=100) != digest(tmp_path, lr_schedule="linear",
                                                                          max_steps=200)
    # inverse_sqrt does not depend on max_steps: such a run may be continued with more steps
    assert digest(tmp_path, max_steps=100) == digest(tmp_path, max_steps=200)
    assert digest(tmp_path, lr_schedule="cosine", max_steps=100) != digest(tmp_path, lr_schedule="linear",
                                                                          max_steps=100)
