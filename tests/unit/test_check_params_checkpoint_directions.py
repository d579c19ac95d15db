"""check_params refuses, before any stage works, a pretrained checkpoint that cannot translate data.directions: a
language its tokenizer has no code for, or a direction a single-direction OPUS-MT checkpoint does not translate.
It reads the checkpoint's files only (a local directory, or a hub checkpoint already in the Hugging Face cache),
and tokenize makes the same check on the tokenizer it loads, before encoding anything."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import (
    DirectionNotTranslated,
    MissingLanguageCode,
    check_local_checkpoint,
    checkpoint_tokens,
)
from stages import check_params, tokenize
from tests.conftest import REPO, write_clean_splits

MULTILINGUAL = ("marian-multi", "mbart", "mbart50", "m2m100", "nllb")
# OPUS-MT's tokenizer_config.json as transformers' Marian converter writes it for Helsinki-NLP/opus-mt-en-de: the
# two languages and nothing else (no tokenizer_class).
HUB_OPUS_MT_CONFIG = {"target_lang": "de", "source_lang": "en"}


def params_for(checkpoint: Path | str, directions: tuple[str, ...], **model) -> object:
    files = {split: {"pattern": f"corpus/{split}.{{lang}}"} for split in ("train", "valid", "test")}
    return parse({"data": {"source": "files", "directions": list(directions), "files": files},
                  "model": {"init": "pretrained", "name_or_path": str(checkpoint), **model}})


def checked(checkpoint: Path | str, directions: tuple[str, ...], root: Path, **model) -> Paths:
    """The check_params stage run on `checkpoint` for `directions`; raises what the stage raises."""
    paths = Paths(root)
    check_params.run(params_for(checkpoint, directions, **model), paths)
    assert paths.params_checked.is_file()
    return paths


def refusal(checkpoint: Path | str, directions: tuple[str, ...], root: Path, error: type = PipelineError) -> str:
    """The message check_params refuses `directions` with; the stage writes nothing."""
    with pytest.raises(error) as raised:
        checked(checkpoint, directions, root)
    assert not Paths(root).params_checked.exists()
    return str(raised.value)


def hub_shaped_opus_mt(tiny_checkpoint, out: Path, tokenizer_config: dict) -> Path:
    """The tiny single-target Marian checkpoint with the tokenizer_config.json an OPUS-MT hub repository has."""
    shutil.copytree(tiny_checkpoint("marian"), out)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    return out


@pytest.mark.parametrize(("family", "directions", "lang", "codes"), [
    ("marian-multi", ("en-de", "en-es"), "es", ">>ces<<, >>deu<<, >>fra<<."),
    ("mbart", ("en-de", "en-pl"), "pl", "ar_AR, cs_CZ, de_DE, en_XX"),
    ("mbart50", ("en-de", "da-en"), "da", "af_ZA, ar_AR, az_AZ"),
    ("m2m100", ("en-de", "en-eo"), "eo", "__af__, __am__, __ar__"),
    ("nllb", ("en-de", "br-en"), "br", "ace_Arab, ace_Latn, acm_Arab"),
])
def test_a_language_without_a_code_is_refused_naming_the_direction_the_language_and_the_codes_there_are(
    family, directions, lang, codes, tiny_checkpoint, tmp_path
):
    message = refusal(tiny_checkpoint(family), directions, tmp_path, MissingLanguageCode)
    assert f"model.name_or_path {tiny_checkpoint(family)} (data.directions ['{directions[1]}'])" in message
    assert f"'{lang}' has no language code in this {family.removesuffix('-multi')} tokenizer" in message
    assert f"its codes: {codes}" in message


@pytest.mark.parametrize("family", MULTILINGUAL)
def test_every_family_accepts_the_directions_it_has_codes_for(family, tiny_checkpoint, tmp_path):
    checked(tiny_checkpoint(family), ("en-de", "en-fr", "en-cs"), tmp_path)


@pytest.mark.parametrize("family", ("mbart", "mbart50", "m2m100", "nllb"))
def test_a_family_that_sets_languages_translates_between_any_two_of_its_codes(family, tiny_checkpoint, tmp_path):
    checked(tiny_checkpoint(family), ("de-en", "fr-de", "cs-fr"), tmp_path)


@pytest.mark.parametrize("family", ("marian", "marian-multi", "mbart", "mbart50", "m2m100", "nllb"))
def test_the_files_name_every_language_code_the_loaded_tokenizer_has(family, tiny_checkpoint):
    from transformers import AutoTokenizer

    from stages.tokenize.checkpoint_tokenizer import tokenizer_vocabulary

    checkpoint = tiny_checkpoint(family)
    kind = check_local_checkpoint(checkpoint)
    loaded = kind.codes_in(tokenizer_vocabulary(AutoTokenizer.from_pretrained(checkpoint)))
    assert kind.codes_in(checkpoint_tokens(checkpoint)) == loaded
    # Every code the real tokenizer class has: ML50's 52, M2M-100's 100, NLLB-200's 202.
    assert len(loaded) == {"marian": 0, "marian-multi": 3, "mbart": 25, "mbart50": 52, "m2m100": 100, "nllb": 202}[
        family]


@pytest.mark.parametrize("shape", ("saved", "hub"))
def test_a_single_target_opus_mt_checkpoint_refuses_the_reversed_direction_naming_both(
    shape, tiny_checkpoint, tmp_path
):
    checkpoint = (tiny_checkpoint("marian") if shape == "saved" else
                  hub_shaped_opus_mt(tiny_checkpoint, tmp_path / "opus-mt-en-de", HUB_OPUS_MT_CONFIG))
    message = refusal(checkpoint, ("de-en",), tmp_path / "root", DirectionNotTranslated)
    assert f"model.name_or_path {checkpoint} translates en-de" in message
    assert "source_lang 'en', target_lang 'de'" in message
    assert "not de-en" in message and "'de' is not its source language and 'en' is not its target language" in message
    checked(checkpoint, ("en-de",), tmp_path / "root")


@pytest.mark.parametrize(("direction", "wrong"), [("en-fr", "'fr' is not its target language"),
                                                  ("fr-de", "'fr' is not its source language")])
def test_a_single_target_checkpoint_refuses_another_source_or_target(direction, wrong, tiny_checkpoint, tmp_path):
    message = refusal(tiny_checkpoint("marian"), (direction,), tmp_path, DirectionNotTranslated)
    assert "translates en-de" in message and f"not {direction}" in message and wrong in message


def test_three_letter_codes_and_language_lists_are_read_as_the_languages_they_name(tiny_checkpoint, tmp_path):
    checkpoint = hub_shaped_opus_mt(tiny_checkpoint, tmp_path / "ckpt", {"source_lang": "eng",
                                                                         "target_lang": "de+de_AT+nl"})
    assert "'fr' is not its target language" in refusal(checkpoint, ("en-fr",), tmp_path / "root")
    checked(checkpoint, ("en-de",), tmp_path / "root")


def test_a_group_or_unknown_language_is_not_refused_on_a_guess(tiny_checkpoint, tmp_path):
    # Helsinki-NLP/opus-mt-mul-en: "mul" names no language the check can tell; the target side still counts.
    checkpoint = hub_shaped_opus_mt(tiny_checkpoint, tmp_path / "ckpt", {"source_lang": "mul", "target_lang": "en"})
    assert "'de' is not its target language" in refusal(checkpoint, ("fr-de",), tmp_path / "root")
    checked(checkpoint, ("fr-en",), tmp_path / "root")


def fake_hub_cache(cache: Path, repo_id: str, checkpoint: Path) -> Path:
    """`checkpoint`'s files laid out as huggingface_hub caches a download of `repo_id` (blobs, a snapshot of
    links to them, refs/main naming the snapshot's commit)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, file in enumerate(sorted(checkpoint.iterdir())):
        blob = repo / "blobs" / f"{number:040x}"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_a_hub_checkpoint_in_the_local_cache_is_checked_like_a_local_directory(tiny_checkpoint, tmp_path,
                                                                                monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    fake_hub_cache(tmp_path / "hub", "Helsinki-NLP/opus-mt-en-de",
                   hub_shaped_opus_mt(tiny_checkpoint, tmp_path / "download", HUB_OPUS_MT_CONFIG))

    message = refusal("Helsinki-NLP/opus-mt-en-de", ("de-en",), tmp_path / "root", DirectionNotTranslated)
    assert "model.name_or_path Helsinki-NLP/opus-mt-en-de translates en-de" in message and "not de-en" in message
    checked("Helsinki-NLP/opus-mt-en-de", ("en-de",), tmp_path / "root")
    # Not downloaded yet: nothing to read, so tokenize checks it once it has the files.
    checked("Helsinki-NLP/opus-mt-de-en", ("de-en",), tmp_path / "root")


def test_a_name_that_is_neither_a_directory_nor_a_hub_name_is_refused_naming_the_parameter(tmp_path):
    for name in ("some org/model", "a/b/c", str(tmp_path / "missing")):
        assert "no such directory, and not a hub name" in refusal(name, ("en-de",), tmp_path)


def test_tokenize_makes_the_same_check_on_the_tokenizer_it_loads_before_encoding(tiny_checkpoint, tmp_path):
    write_clean_splits(tmp_path, {"train": 20, "valid": 5, "test": 5}, ("de-en",))
    paths = Paths(tmp_path)
    with pytest.raises(DirectionNotTranslated, match=r"translates en-de .*not de-en"):
        tokenize.run(params_for(tiny_checkpoint("marian"), ("de-en",)), paths)
    assert not paths.tokenized.exists()


def test_the_check_reads_files_only_without_importing_torch_or_transformers(tiny_checkpoint):
    probe = ("import sys\n"
             "from pipeline.runtime.languages import Directions\n"
             "from stages.check_params import check_checkpoint\n"
             f"check_checkpoint({str(tiny_checkpoint('nllb'))!r}, Directions.of(['en-de', 'de-fr']), {{}})\n"
             "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
