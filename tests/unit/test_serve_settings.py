"""pipeline/runtime/serve/settings.py, pipeline/runtime/serve/languages.py and `mtpipe serve`'s flags: a bad setting or
a directory that is not an export stops the command before anything loads or listens, with the flag or file in the
message; a request's languages are checked against the model's directions."""

from __future__ import annotations

import argparse

import pytest

from pipeline.runtime.languages import Direction, Directions
from pipeline.runtime.serve.languages import ServedLanguages, UnsupportedLanguage
from pipeline.runtime.serve.settings import ServeSettings, SettingsError, flag
from pipeline.tools.cli import _add_serve_parser, main


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("workers", 0, "--workers must be at least 1, got 0"),
        ("max_batch_tokens", 0, "--max-batch-tokens must be at least 1, got 0"),
        ("max_line_tokens", 1, "--max-line-tokens must be at least 2, got 1"),
        ("beam", 0, "--beam must be at least 1, got 0"),
        ("port", 70000, "--port must be within 0-65535, got 70000"),
        ("max_wait_ms", -1.0, "--max-wait-ms must not be negative, got -1.0"),
        ("request_timeout_s", 0.0, "--request-timeout-s must be positive, got 0.0"),
        ("max_queued_lines", 10, "--max-queued-lines (10) must be at least --max-lines (128)"),
    ],
)
def test_an_out_of_range_setting_is_refused_naming_its_flag(field, value, message):
    with pytest.raises(SettingsError) as caught:
        ServeSettings(model_dir="unused", **{field: value})
    assert message in str(caught.value)


def test_every_setting_is_set_by_the_flag_its_errors_name():
    parser = argparse.ArgumentParser()
    _add_serve_parser(parser.add_subparsers(dest="command"))
    switches = {"int8", "access_log"}
    for name in ServeSettings.__dataclass_fields__:
        if name == "model_dir":
            assert parser.parse_args(["serve", "--model", "x"]).model_dir == "x"
        elif name in switches:
            assert getattr(parser.parse_args(["serve", flag(name)]), name) is True
        elif name == "host":
            assert parser.parse_args(["serve", "--host", "0.0.0.0"]).host == "0.0.0.0"
        else:
            assert getattr(parser.parse_args(["serve", flag(name), "3"]), name) == 3, name


def test_the_command_stops_on_a_bad_setting_before_loading_anything(capsys, tmp_path):
    assert main(["serve", "--model", str(tmp_path), "--workers", "0"]) == 1
    assert "mtpipe serve: --workers must be at least 1, got 0" in capsys.readouterr().err


def test_the_command_stops_on_a_directory_that_is_not_an_export(capsys, tmp_path):
    assert main(["serve", "--model", str(tmp_path)]) == 1
    assert f"{tmp_path / 'export.json'} not found: is {tmp_path} an export directory" in capsys.readouterr().err


def test_a_one_direction_model_takes_its_source_or_auto_and_lists_one_target_by_name():
    languages = ServedLanguages(Directions.of(["en-de"]))
    assert languages.listing() == [{"code": "en", "name": "English", "targets": ["de"]}]
    assert languages.direction("en", "de") == Direction("en", "de")
    assert languages.detected(["A man rides a bike."], "de")[0] == Direction("en", "de")
    with pytest.raises(UnsupportedLanguage, match=r"target 'en' is not one of this model's targets: de "
                                                  r"\(directions: en-de\)"):
        languages.direction("en", "en")
    with pytest.raises(UnsupportedLanguage, match=r"this model does not translate fr-de; its directions: en-de"):
        languages.direction("fr", "de")


def test_a_model_with_several_targets_accepts_each_and_lists_them_under_their_source():
    languages = ServedLanguages(Directions.of(["en-de", "en-fr"]))
    for target in ("de", "fr"):
        assert languages.direction("en", target) == Direction("en", target)
        assert languages.detected(["Two dogs play in the snow."], target)[0] == Direction("en", target)
    with pytest.raises(UnsupportedLanguage, match=r"target 'cs' is not one of this model's targets: de, fr"):
        languages.detected(["Two dogs play in the snow."], "cs")
    assert languages.listing() == [{"code": "en", "name": "English", "targets": ["de", "fr"]}]


def test_auto_picks_the_detected_source_where_several_sources_go_into_the_target():
    languages = ServedLanguages(Directions.of(["en-fr", "de-fr", "en-de"]))
    assert languages.listing() == [{"code": "en", "name": "English", "targets": ["fr", "de"]},
                                   {"code": "de", "name": "German", "targets": ["fr"]}]
    direction, detection = languages.detected(["Zwei Hunde spielen im Schnee und ein Mann schaut zu."], "fr")
    assert direction == Direction("de", "fr") and detection.language == "de" and 50 < detection.confidence <= 100
    assert languages.detected(["Two dogs play in the snow while a man watches."], "fr")[0] == Direction("en", "fr")
    # Only the sources that go into the target are candidates: de does not go into de.
    assert languages.detected(["Zwei Hunde spielen im Schnee."], "de")[0] == Direction("en", "de")
