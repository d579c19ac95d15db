"""One source of defaults: every key of the schema is in params.yaml, at the schema's default where it has one.

A default that differs from the file would be a second, hidden setting: a user deleting a line from params.yaml
would get a value they never saw. Fields without a default (required) may take any value; the model's architecture
fields default to "as the preset says" (null), so params.yaml may set them to override the preset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pipeline.params import PRESETS, ModelParams, Params
from pipeline.runtime.languages import Directions

REPO = Path(__file__).resolve().parents[2]
PARAMS_YAML = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
PRESET_OVERRIDES = {f"model.{field}" for field in next(iter(PRESETS.values()))}
# The sample's own choices against the schema's default, each said in params.yaml's comment on the key (which names
# the default), so deleting the line gives the value the comment names: the tiny sample model trains in fp32,
# where the default `auto` would pick bf16 on a CPU with native bf16, for no time saved and a worse model.
SAMPLE_CHOICES = {"train.precision": "fp32"}


def schema_keys(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Each leaf key of the schema as a dotted path -> its default (PydanticUndefined when it has none)."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.update(schema_keys(annotation, key + "."))
        else:
            keys[key] = field.get_default(call_default_factory=True)
    return keys


def file_value(dotted: str, params: dict[str, Any] | None = None) -> Any:
    node: Any = PARAMS_YAML if params is None else params
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def as_plain(value: Any) -> Any:
    """A schema default as YAML would spell it (tuples are lists, dicts stay dicts, directions their names)."""
    if isinstance(value, Directions):
        return value.names
    return list(value) if isinstance(value, tuple) else value


def test_every_schema_key_is_in_params_yaml():
    missing = []
    for key in schema_keys(Params):
        try:
            file_value(key)
        except KeyError:
            missing.append(key)
    assert not missing, f"params.yaml lacks these schema keys: {missing}"


def test_every_default_is_the_value_params_yaml_sets():
    differing = {}
    for key, default in schema_keys(Params).items():
        if default is PydanticUndefined or key in PRESET_OVERRIDES:
            continue
        value = file_value(key)
        if key in SAMPLE_CHOICES:
            assert value == SAMPLE_CHOICES[key], key
            continue
        if as_plain(default) != value:
            differing[key] = {"schema": default, "params.yaml": value}
    assert not differing, f"schema defaults that contradict params.yaml: {differing}"


def test_each_sample_choice_against_a_default_is_explained_beside_it_naming_the_default():
    text = (REPO / "params.yaml").read_text(encoding="utf-8")
    for key in SAMPLE_CHOICES:
        section, name = key.split(".")
        block = text.split(f"\n{section}:\n", 1)[1].split(f"\n  {name}:", 1)[0].rsplit("\n", 4)[1:]
        default = schema_keys(Params)[key]
        assert any(f"{default} (the default)" in line for line in block), key


@pytest.mark.parametrize("config", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_names_every_key_so_a_default_never_changes_its_run(config):
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    missing = []
    for key in schema_keys(Params):
        try:
            file_value(key, raw)
        except KeyError:
            missing.append(key)
    assert not missing, f"{config.name} lacks {missing}"


def test_the_preset_overrides_default_to_the_preset():
    assert PRESET_OVERRIDES == {f"model.{k}" for k in ("d_model", "encoder_layers", "decoder_layers",
                                                       "attention_heads", "ffn_dim", "dropout",
                                                       "attention_dropout", "activation_dropout", "activation")}
    for key in PRESET_OVERRIDES:
        assert ModelParams.model_fields[key.removeprefix("model.")].default is None, key


def test_the_walk_sees_every_section_and_fails_on_a_missing_key(monkeypatch):
    keys = schema_keys(Params)
    assert {k.split(".")[0] for k in keys} == {"data", "clean", "validate", "tokenize", "model", "train", "evaluate",
                                               "export", "card", "distill"}
    assert "distill.train.lr" in keys and "distill.model.preset" in keys  # the student's blocks, walked too
    trimmed = {**PARAMS_YAML, "train": {k: v for k, v in PARAMS_YAML["train"].items() if k != "lr"}}
    monkeypatch.setitem(globals(), "PARAMS_YAML", trimmed)
    try:
        test_every_schema_key_is_in_params_yaml()
    except AssertionError as err:
        assert "train.lr" in str(err)
    else:
        raise AssertionError("a key missing from params.yaml went unnoticed")
