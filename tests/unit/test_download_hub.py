"""download stage, data.source: hub: a Hugging Face dataset that holds translations, read through `datasets` from
local directories in the hub's layouts (tests/support/hub_layouts.py), every direction from its configuration."""

from __future__ import annotations

import hashlib
import json

import pyarrow.parquet as pq
import pytest

from pipeline.artifacts import Paths
from pipeline.errors import HubUnreachable
from pipeline.params import ParamsError, parse
from pipeline.runtime.errors import InputFileError, PipelineError
from stages import download
from tests.support.hub_layouts import (
    write_cardless_parquet,
    write_jsonl_repo,
    write_translation_repo,
)


def hub_params(hub: dict, directions: list[str] | None = None, **data):
    return parse({"data": {"source": "hub", "directions": directions or ["en-de"], "hub": hub, **data}})


def read_split(paths: Paths, split: str) -> dict[str, list]:
    return pq.read_table(paths.split_file(paths.raw, split)).to_pydict()


def manifest_of(paths: Paths) -> dict:
    return json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))


# --- the shapes a dataset comes in ----------------------------------------------------------------------------


def test_a_translation_column_repository_gives_each_direction_from_its_pair_config_either_way_round(tmp_path):
    # Helsinki-NLP/opus-100's shape: configs named in alphabetical order, de-en serving en-de, en-fr serving fr-en.
    repo = write_translation_repo(tmp_path / "opus", ["de-en", "en-fr"])
    paths = Paths(tmp_path / "project")

    metrics = download.run(hub_params({"path": str(repo)}, ["en-de", "fr-en"]), paths)

    assert metrics == {"source": "hub", "train_pairs": 24, "valid_pairs": 6, "test_pairs": 4,
                       "train_pairs_en-de": 12, "train_pairs_fr-en": 12}
    test = read_split(paths, "test")
    assert list(zip(test["src_lang"], test["tgt_lang"], test["src"], test["tgt"], strict=True)) == [
        ("en", "de", "en test 0", "de test 0"), ("en", "de", "en test 1", "de test 1"),
        ("fr", "en", "fr test 0", "en test 0"), ("fr", "en", "fr test 1", "en test 1"),
    ]
    assert test["origin"] == [f"{repo}:de-en:test"] * 2 + [f"{repo}:en-fr:test"] * 2 and test["line"] == [1, 2] * 2
    manifest = manifest_of(paths)
    assert manifest["configs"] == {"en-de": "de-en", "fr-en": "en-fr"} and manifest["revision"] is None
    data_file = repo / "de-en" / "train-00000-of-00001.parquet"
    assert manifest["inputs"][str(data_file)] == hashlib.sha256(data_file.read_bytes()).hexdigest()
    assert len(manifest["inputs"]) == 6  # three splits of two configs


def test_one_text_column_per_language_in_json_lines_reads_like_bentrevett_multi30k(tmp_path):
    rows = {name: [{"en": f"A dog {name} {i}.", "de": f"Ein Hund {name} {i}."} for i in range(n)]
            for name, n in (("train", 5), ("val", 2), ("test", 3))}
    repo = write_jsonl_repo(tmp_path / "multi30k", rows)
    paths = Paths(tmp_path)
    # val.jsonl is the validation split, as datasets names splits from file names.
    splits = {"train": "train", "valid": "validation", "test_2016_flickr": "test"}

    download.run(hub_params({"path": str(repo), "splits": splits}, ["de-en"]), paths)

    flickr = read_split(paths, "test_2016_flickr")
    assert flickr["src"] == [f"Ein Hund test {i}." for i in range(3)]
    assert flickr["tgt"] == [f"A dog test {i}." for i in range(3)]
    manifest = manifest_of(paths)
    assert manifest["configs"] == {"de-en": "default"}
    assert manifest["splits"] == {"train": 5, "valid": 2, "test_2016_flickr": 3}
    assert sorted(manifest["inputs"]) == [str(repo / f"{name}.jsonl") for name in ("test", "train", "val")]

    splits["valid"] = "dev"
    message = run_refused(hub_params({"path": str(repo), "splits": splits}), Paths(tmp_path / "again"))
    assert message.endswith("no split 'dev' (data.hub.splits.valid); its splits are train, validation, test")


def test_a_directory_of_parquet_files_without_a_card_is_one_config_with_the_columns_named_in_params(tmp_path):
    repo = tmp_path / "flat"
    for split, n in (("train", 12), ("validation", 2), ("test", 2)):
        write_cardless_parquet(repo, {"english": [f"e{i}" for i in range(n)], "german": [f"g{i}" for i in range(n)],
                                      "id": list(range(n))}, split)
    paths = Paths(tmp_path)

    download.run(hub_params({"path": str(repo), "columns": {"en": "english", "de": "german"}},
                            max_train_pairs=4), paths)

    # The size comes from the Parquet footers (no card states it), so the cap is spread over all 12 rows.
    assert read_split(paths, "train")["src"] == ["e2", "e5", "e8", "e11"]
    assert manifest_of(paths)["subsample"]["en-de"] == {"max_train_pairs": 4, "method": "spread", "from_pairs": 12}


def test_a_relative_directory_is_read_from_the_project_root_and_named_as_written(tmp_path):
    write_translation_repo(tmp_path / "corpus" / "wmt16", ["ro-en"])
    paths = Paths(tmp_path)

    download.run(hub_params({"path": "corpus/wmt16", "name": "ro-en"}, ["en-ro"]), paths)

    assert set(read_split(paths, "valid")["origin"]) == {"corpus/wmt16:ro-en:validation"}
    assert manifest_of(paths)["dataset"] == "corpus/wmt16"


def test_configurations_may_be_named_per_direction(tmp_path):
    repo = write_translation_repo(tmp_path / "iwslt", ["iwslt2017-en-de", "iwslt2017-de-en", "iwslt2017-en-fr"])
    paths = Paths(tmp_path)

    # Two configurations serve en-de either way round: data.hub.name says which each direction reads.
    name = {"en-de": "iwslt2017-en-de", "de-en": "iwslt2017-en-de", "en-fr": "iwslt2017-en-fr"}
    download.run(hub_params({"path": str(repo), "name": name}, ["en-de", "de-en", "en-fr"]), paths)

    assert manifest_of(paths)["configs"] == name


# --- what does not exist stops the stage before a row is written, naming it and what exists ------------------


def run_refused(params, paths: Paths, error=PipelineError) -> str:
    with pytest.raises(error) as err:
        download.run(params, paths)
    assert not paths.raw.exists()
    return str(err.value)


def test_an_unknown_configuration_is_named_with_those_the_dataset_has(tmp_path):
    repo = write_translation_repo(tmp_path / "opus", ["de-en", "en-fr"])

    message = run_refused(hub_params({"path": str(repo), "name": "en-de"}), Paths(tmp_path))

    assert "no configuration 'en-de' (data.hub.name); its configurations are de-en, en-fr" in message


def test_a_direction_no_configuration_serves_is_named_with_the_configurations(tmp_path):
    repo = write_translation_repo(tmp_path / "opus", ["de-en", "en-fr"])

    message = run_refused(hub_params({"path": str(repo)}, ["en-de", "en-ro"]), Paths(tmp_path))

    assert "no configuration for en-ro either way round; its configurations are de-en, en-fr" in message
    assert message.endswith("set data.hub.name")


def test_two_configurations_of_one_pair_ask_for_data_hub_name(tmp_path):
    repo = write_translation_repo(tmp_path / "iwslt", ["iwslt2017-en-de", "iwslt2017-de-en"])

    message = run_refused(hub_params({"path": str(repo)}), Paths(tmp_path))

    assert "several configurations for en-de (iwslt2017-en-de, iwslt2017-de-en): set data.hub.name" in message


def test_an_unknown_split_is_named_with_the_splits_the_dataset_has(tmp_path):
    repo = write_translation_repo(tmp_path / "opus", ["de-en"])
    splits = {"train": "train", "valid": "dev", "test": "test"}

    message = run_refused(hub_params({"path": str(repo), "splits": splits}), Paths(tmp_path))

    assert "configuration de-en: no split 'dev' (data.hub.splits.valid)" in message
    assert message.endswith("its splits are train, validation, test")


def test_an_unknown_column_is_named_with_the_columns_the_dataset_has(tmp_path):
    repo = tmp_path / "flat"
    for split in ("train", "validation", "test"):
        write_cardless_parquet(repo, {"english": ["e"], "german": ["g"]}, split)

    message = run_refused(hub_params({"path": str(repo), "columns": {"en": "english", "de": "deutsch"}}),
                          Paths(tmp_path))
    assert "no column deutsch (data.hub.columns); its columns are english, german" in message

    message = run_refused(hub_params({"path": str(repo)}), Paths(tmp_path))
    assert "no 'translation' column and no columns named en and de; its columns are english, german" in message


def test_a_translation_column_without_a_language_of_the_direction_is_refused_with_its_languages(tmp_path):
    repo = write_translation_repo(tmp_path / "wmt16", ["ro-en"])

    message = run_refused(hub_params({"path": str(repo)}, ["en-de"]), Paths(tmp_path))

    # Its only configuration is taken, and its languages say it cannot serve en-de.
    assert "configuration ro-en: its 'translation' column has no de text; its languages are en, ro" in message


def test_a_row_without_text_is_an_error_naming_the_dataset_split_and_row(tmp_path):
    rows = {"train": [{"en": "One.", "de": "Eins."}, {"en": "Two.", "de": None}], "val": [{"en": "a", "de": "b"}],
            "test": [{"en": "a", "de": "b"}]}
    repo = write_jsonl_repo(tmp_path / "m", rows)

    message = run_refused(hub_params({"path": str(repo)}), Paths(tmp_path), InputFileError)

    assert f"{repo}:default:train, line 2: row has no de text (de is None)" in message


def test_a_missing_local_directory_is_refused_naming_the_parameter(tmp_path):
    message = run_refused(hub_params({"path": "./corpus/nowhere"}), Paths(tmp_path))

    assert "data.hub.path './corpus/nowhere': no such directory" in message


def test_a_local_directory_with_a_revision_is_refused(tmp_path):
    repo = write_translation_repo(tmp_path / "opus", ["de-en"])

    message = run_refused(hub_params({"path": str(repo), "revision": "v1"}), Paths(tmp_path))

    assert "data.hub.revision 'v1'" in message and "local directory" in message


def test_a_hub_dataset_without_a_route_to_the_hub_fails_at_once_saying_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    message = run_refused(hub_params({"path": "bentrevett/multi30k"}), Paths(tmp_path), HubUnreachable)

    assert "HF_HUB_OFFLINE is set" in message
    assert "hf download bentrevett/multi30k --repo-type dataset --local-dir DIR" in message
    assert "data.hub: {path: DIR, splits: {train: train, valid: validation, test: test}}" in message


# --- what params.yaml can say without the dataset ------------------------------------------------------------


def test_hub_params_need_the_dataset_train_valid_and_a_test_split():
    with pytest.raises(ParamsError, match="source 'hub' needs data.hub"):
        parse({"data": {"source": "hub"}})
    with pytest.raises(ParamsError, match=r"data.hub.splits: needs valid"):
        hub_params({"path": "x", "splits": {"train": "train", "test": "test"}})
    with pytest.raises(ParamsError, match=r"data.hub.splits: needs at least one test split"):
        hub_params({"path": "x", "splits": {"train": "train", "valid": "validation"}})
    with pytest.raises(ParamsError, match=r"split name 'news 2014' must be letters"):
        hub_params({"path": "x", "splits": {"train": "a", "valid": "b", "news 2014": "c"}})


def test_hub_columns_and_configurations_must_cover_every_direction():
    with pytest.raises(ParamsError, match=r"data.hub.columns names no column for \['fr'\]"):
        hub_params({"path": "x", "columns": {"en": "english", "de": "german"}}, ["en-de", "en-fr"])
    with pytest.raises(ParamsError, match=r"data.hub.name names no configuration for \['en-fr'\]"):
        hub_params({"path": "x", "name": {"en-de": "de-en"}}, ["en-de", "en-fr"])
    with pytest.raises(ParamsError, match="set data.hub.revision"):
        hub_params({"path": "x"}, revision="main")


def test_wmt14_is_the_hub_source_with_its_preset():
    hub = parse({"data": {"source": "wmt14", "revision": "abc"}}).data.hub_dataset()

    assert (hub.path, hub.revision, hub.columns) == ("wmt/wmt14", "abc", "translation")
    assert hub.splits == {"train": "train", "valid": "validation", "newstest2014": "test"}


@pytest.mark.parametrize(("error", "expected"), [
    ("RepositoryNotFoundError", "data.hub.path 'someone/nothing': no such dataset on the hub, and no such local"),
    ("RevisionNotFoundError", "data.hub.revision 'v9': someone/nothing has no such branch, tag or commit"),
    ("GatedRepoError", "a gated dataset; accept its terms on the hub and set HF_TOKEN"),
])
def test_a_dataset_or_revision_the_hub_does_not_have_is_named(tmp_path, monkeypatch, error, expected):
    # The hub's answer is faked (the hub is unreachable from the tests); everything after it is the stage's.
    import httpx
    from huggingface_hub import HfApi, errors

    from stages.download import hub

    answer = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/datasets/someone/nothing"))

    def dataset_info(self, path, revision=None):
        raise getattr(errors, error)(f"{answer.status_code} Client Error", response=answer)

    monkeypatch.setattr(hub, "check_hub_reachable", lambda params: None)
    monkeypatch.setattr(HfApi, "dataset_info", dataset_info)

    message = run_refused(hub_params({"path": "someone/nothing", "revision": "v9"}), Paths(tmp_path))

    assert expected in message
