"""params.yaml is the product's interface: invalid settings fail before any work, naming the key and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.params import PRESETS, ParamsError, load, parse

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_params_file_is_valid_and_uses_the_embedded_sample():
    params = load(REPO / "params.yaml")
    assert params.data.source == "sample"
    assert params.data.directions.names == ["en-de"]


def test_defaults_are_valid_without_any_file_content():
    params = parse({})
    assert params.model.preset == "tiny" and params.train.precision == "auto"


def test_unknown_key_is_rejected_with_its_dotted_name():
    with pytest.raises(ParamsError, match=r"train\.max_step: unknown key \(value 5\)"):
        parse({"train": {"max_step": 5}})


def test_unknown_section_is_rejected():
    with pytest.raises(ParamsError, match="trian: unknown key"):
        parse({"trian": {}})


def test_a_misspelt_key_is_told_the_key_it_resembles():
    with pytest.raises(ParamsError, match=r"trian: unknown key \(a section of 1 key\); did you mean 'train'\?"):
        parse({"trian": {"lr": 0.1}})
    with pytest.raises(ParamsError, match=r"validate\.min_row: unknown key \(value 3\); did you mean 'validate\.min_"):
        parse({"validate": {"min_row": 3}})
    with pytest.raises(ParamsError, match=r"train\.zzz: unknown key \(value 1\); check the spelling"):
        parse({"train": {"zzz": 1}})


def test_wrong_type_names_the_key_and_the_bad_value():
    with pytest.raises(ParamsError, match=r"train\.max_steps = 'many'"):
        parse({"train": {"max_steps": "many"}})


def test_out_of_range_value_names_the_key_and_the_bad_value():
    with pytest.raises(ParamsError, match=r"train\.lr = -0\.1: Input should be greater than 0"):
        parse({"train": {"lr": -0.1}})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"train": {"precision": "fp8"}}, r"train\.precision = 'fp8'"),
        ({"model": {"preset": "huge"}}, r"model\.preset = 'huge'"),
        ({"data": {"source": "s3"}}, r"data\.source = 's3'"),
        ({"train": {"nproc": 0}}, r"train\.nproc = 0"),
        ({"train": {"nproc": "all"}}, r"train\.nproc"),
    ],
)
def test_invalid_choices_are_rejected(raw, message):
    with pytest.raises(ParamsError, match=message):
        parse(raw)


def test_every_error_is_reported_at_once():
    with pytest.raises(ParamsError) as err:
        parse({"train": {"lr": 0, "max_tokens": 1}, "evaluate": {"beam": 0}})
    text = str(err.value)
    assert "3 invalid parameter(s)" in text
    assert "train.lr" in text and "train.max_tokens" in text and "evaluate.beam" in text


def test_files_source_requires_train_valid_and_a_test_split():
    with pytest.raises(ParamsError, match=r"data.files.valid"):
        parse({"data": {"source": "files", "files": {"train": {"src": "a", "tgt": "b"}}}})
    files = {s: {"src": f"{s}.en", "tgt": f"{s}.de"} for s in ("train", "valid")}
    with pytest.raises(ParamsError, match="at least one test split"):
        parse({"data": {"source": "files", "files": files}})
    files["newstest2014"] = {"src": "t.en", "tgt": "t.de"}
    assert set(parse({"data": {"source": "files", "files": files}}).data.files) == {"train", "valid", "newstest2014"}


def test_wmt14_only_accepts_its_language_pairs():
    directions = ["de-en", "en-cs", "ru-en"]
    assert parse({"data": {"source": "wmt14", "directions": directions}}).data.directions.sources == ["de", "en", "ru"]
    with pytest.raises(ParamsError, match="WMT14 has no de-fr pair"):
        parse({"data": {"source": "wmt14", "directions": ["en-de", "de-fr"]}})


def test_the_old_language_keys_say_what_replaced_them():
    with pytest.raises(ParamsError) as err:
        parse({"data": {"src_lang": "en", "tgt_lang": "de"}})
    assert "data.src_lang: replaced by data.directions: write `directions: [en-de]`" in str(err.value)
    assert "data.tgt_lang: replaced by data.directions" in str(err.value)


@pytest.mark.parametrize(
    ("directions", "message"),
    [
        (["en-de", "en-fr", "en-de"], "en-de is listed twice"),
        (["en-en"], "source and target are the same language"),
        (["english-german"], "is not a direction"),
        ([], "a non-empty list"),
    ],
)
def test_bad_directions_are_named(directions, message):
    with pytest.raises(ParamsError, match=message):
        parse({"data": {"source": "wmt14", "directions": directions}})


def test_the_sample_holds_english_german_only():
    assert parse({"data": {"directions": ["de-en"]}}).data.directions.names == ["de-en"]
    with pytest.raises(ParamsError, match=r"the embedded sample is English-German.*\['en-de', 'en-fr'\]"):
        parse({"data": {"directions": ["en-de", "en-fr"]}})


def _files(**splits):
    return {"source": "files", "directions": ["en-de", "en-fr"], "files": splits}


def test_several_directions_read_per_language_patterns_and_directed_files():
    data = parse({"data": _files(
        train={"pattern": "corpus/train.{lang}.gz"},
        valid=[{"src": "v.en", "tgt": "v.de", "direction": "en-de"}, {"tsv": "v.tsv", "columns": ["fr", "en"]}],
        test={"dir": "corpus", "prefix": "test"},
    )}).data
    assert data.directions.target_tags and data.directions.tags == [">>de<<", ">>fr<<"]
    assert data.files["train"][0].pattern == "corpus/train.{lang}.gz"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"src": "v.en", "tgt": "v.de"},
         r"data.files.valid: \{src: v.en, tgt: v.de\} needs `direction:` \(one of en-de, en-fr\)"),
        ({"src": "v.en", "tgt": "v.cs", "direction": "en-cs"}, "direction en-cs, which is not in data.directions"),
        ({"tsv": "v.tsv"}, "v.tsv needs `columns:`"),
        ({"tsv": "v.tsv", "columns": ["en", "cs"]}, r"columns \['en', 'cs'\], which no direction"),
        ({"pattern": "v.gz"}, "has no {lang} placeholder"),
    ],
)
def test_an_entry_of_several_directions_must_say_which(entry, message):
    with pytest.raises(ParamsError, match=message):
        parse({"data": _files(train={"pattern": "t.{lang}"}, valid=entry, test={"pattern": "t.{lang}"})})


def test_a_language_without_a_known_script_is_refused_while_scripts_are_checked():
    raw = {"data": _files(train={"pattern": "t.{lang}"}, valid={"pattern": "v.{lang}"}, test={"pattern": "x.{lang}"})}
    raw["data"]["directions"] = ["en-de", "en-xx"]
    with pytest.raises(ParamsError, match="no script is known for 'xx'.*clean.min_script_share: 0"):
        parse(raw)
    assert parse({**raw, "clean": {"min_script_share": 0}}).data.directions.languages == ["en", "de", "xx"]


def test_macro_is_not_a_split_name():
    with pytest.raises(ParamsError, match="split name 'macro' is taken"):
        parse({"data": {"source": "files", "files": {
            "train": {"src": "a", "tgt": "b"}, "valid": {"src": "a", "tgt": "b"}, "macro": {"src": "a", "tgt": "b"}}}})


def test_model_fields_override_the_preset():
    arch = parse({"model": {"preset": "cpu-ref", "encoder_layers": 6}}).model.architecture()
    assert arch == {**PRESETS["cpu-ref"], "encoder_layers": 6}


def test_cpu_ref_and_base_presets_match_their_definitions():
    assert PRESETS["cpu-ref"] == dict(
        d_model=256, encoder_layers=3, decoder_layers=3, attention_heads=4, ffn_dim=1024, dropout=0.1,
        attention_dropout=0.0, activation_dropout=0.0, activation="relu",
    )
    assert PRESETS["base"]["d_model"] == 512 and PRESETS["big"]["attention_heads"] == 16


def test_heads_must_divide_the_model_width():
    with pytest.raises(ParamsError, match="divisible by attention_heads"):
        parse({"model": {"d_model": 100, "attention_heads": 8}})


def test_pretrained_init_needs_a_path():
    with pytest.raises(ParamsError, match="name_or_path"):
        parse({"model": {"init": "pretrained"}})


def test_missing_and_malformed_files_are_clear_errors(tmp_path):
    with pytest.raises(ParamsError, match="params file not found"):
        load(tmp_path / "params.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ParamsError, match="must be a mapping"):
        load(bad)


def test_separate_vocabularies_are_for_one_direction():
    raw = {"data": {"source": "wmt14", "directions": ["en-de", "de-en"]}, "tokenize": {"joint": False},
           "model": {"tie_embeddings": False}}
    with pytest.raises(ParamsError, match="tokenize.joint: false .* is for one direction"):
        parse(raw)
    assert parse({**raw, "data": {"source": "wmt14", "directions": ["en-de"]}}).tokenize.joint is False


def test_direction_weights_must_name_the_runs_directions_and_be_positive():
    several = {"source": "files", "directions": ["en-de", "en-fr"],
               "files": {split: {"pattern": f"{split}.{{lang}}.gz"} for split in ("train", "valid", "test")}}
    assert parse({"data": several, "train": {"direction_weights": {"en-de": 2}}}).train.direction_weights == {
        "en-de": 2.0}
    with pytest.raises(ParamsError, match=r"train\.direction_weights: en-cs is not in data\.directions"):
        parse({"data": several, "train": {"direction_weights": {"en-cs": 2}}})
    with pytest.raises(ParamsError, match=r"distill\.train\.direction_weights: de-en is not in data\.directions"):
        parse({"data": several, "distill": {"train": {"direction_weights": {"de-en": 2}}}})
    with pytest.raises(ParamsError,
                       match=r"train\.direction_weights: weights must be positive and finite, got \{'en-de': 0\.0\}"):
        parse({"data": several, "train": {"direction_weights": {"en-de": 0}}})
