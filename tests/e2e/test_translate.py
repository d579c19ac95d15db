"""pipeline/runtime/translate.py and `mtpipe translate`: the exported model on ONNX Runtime, without torch.

The export is the session fixture `exported` (tests/e2e/conftest.py): the sharpened tiny model, whose outputs are
garbage but decisive, so comparisons with transformers test the search, not float noise. The search semantics are
also pinned on a scripted fake model whose next-token probabilities are a table (tests/unit/test_beam_search.py).
Choosing a direction (`tgt`, `src`, `--tgt`) runs on `two_target_exported`, a model of en-de and en-fr whose
sources carry >>de<< / >>fr<<.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.runtime.beam_search import beam_search
from pipeline.runtime.decoding import pad_batch
from pipeline.runtime.errors import InputFileError
from pipeline.runtime.export_format import ExportDirError
from pipeline.runtime.languages import Direction, UnknownDirection
from pipeline.runtime.translate import MarianSentencePiece, OnnxSeq2Seq, Translator, read_lines
from tests.support.export_helpers import SENTENCES, load_model

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("torch_on_one_thread")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def export_dir(exported) -> Path:
    return exported[0].export


@pytest.fixture(scope="module")
def translator(export_dir) -> Translator:
    return Translator(export_dir)


# --------------------------------------------------------------------------------------------------- no torch


def test_translating_imports_neither_torch_nor_transformers(export_dir):
    code = (
        "import json, sys\n"
        "import pipeline.tools.cli\n"
        "from pipeline.runtime.translate import Translator\n"
        f"out = Translator({str(export_dir)!r}).translate(['A dog runs.', ''], beam=2)\n"
        "print(json.dumps({'out': out, 'heavy': [m for m in ('torch', 'transformers') if m in sys.modules]}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    assert report["heavy"] == []
    assert report["out"][0] and report["out"][1] == ""


def test_the_sentencepiece_tokenizer_gives_marian_tokenizers_ids_and_text(export_dir):
    from transformers import AutoTokenizer

    ours, theirs = MarianSentencePiece(export_dir), AutoTokenizer.from_pretrained(export_dir)
    texts = [*SENTENCES, "naïve café ☃ 𝄞 — «quotes»", "  leading and trailing  ", ">>de<< with a language code",
             "tab\tinside", "12,345.67 %", "ÄÖÜß"]
    for text in texts:
        assert ours.encode(text) == theirs(text)["input_ids"], text
    rng = np.random.default_rng(0)
    special = [ours.eos_id, ours.unk_id, ours.pad_id]
    for _ in range(50):
        ids = rng.integers(0, len(ours.vocab), size=int(rng.integers(1, 30))).tolist() + special
        rng.shuffle(ids)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids


# --------------------------------------------------------------------------------------------------- search vs generate


@pytest.mark.parametrize("beam", [1, 4])
def test_search_gives_the_same_hypotheses_as_transformers_generate(exported, translator, beam):
    import torch

    paths, _ = exported
    model, tokenizer = load_model(paths.final_model)
    sources = [tokenizer(s)["input_ids"] for s in SENTENCES]
    input_ids, attention_mask = pad_batch(sources, translator.ids.pad)
    # generate has one length limit per batch; give the ONNX search the same one for every sentence.
    limit = translator.max_new_tokens(input_ids.shape[1])
    with torch.no_grad():
        generated = model.generate(input_ids=torch.from_numpy(input_ids),
                                   attention_mask=torch.from_numpy(attention_mask), num_beams=beam,
                                   max_length=limit + 1, early_stopping=True, length_penalty=1.0, do_sample=False)
    expected = [[t for t in row[1:].tolist() if t != translator.ids.pad] for row in generated]
    ours = beam_search(translator.model, input_ids, attention_mask, beam=beam, max_new_tokens=[limit] * len(sources),
                       ids=translator.ids, length_penalty=1.0)
    # The untrained model never ends on its own, so this pins the forced </s> at the limit (scored as generate
    # scores it); ending by itself is pinned on the scripted model below.
    assert ours == expected


def test_the_translator_gives_the_evaluate_stages_translations(exported, translator):
    from pipeline.params import EvaluateParams
    from pipeline.runtime.model_languages import ModelLanguages
    from stages.evaluate import translate

    paths, _ = exported
    model, tokenizer = load_model(paths.final_model)
    # The layout as evaluate reads it: from the trained model's languages.json, not the export's copy.
    layout = ModelLanguages.read(paths.final_model).layout(translator.direction())
    # Sentences of different lengths in one batch: each has its own length limit in both.
    cfg = EvaluateParams(beam=4)
    assert translator.translate(SENTENCES, beam=4) == translate(model, tokenizer, layout, SENTENCES, cfg,
                                                                progress_bar=False)


def test_each_decoding_step_feeds_one_token_per_row_against_a_cache_one_token_longer(translator):
    calls = []

    class Recording(OnnxSeq2Seq):
        def __init__(self, inner):
            self.__dict__.update(inner.__dict__)

        def decode(self, decoder_input_ids, encoder_attention_mask, self_cache, cross_cache, logits=True,
                   cache_rows=None):
            calls.append((decoder_input_ids.shape, self_cache[0].shape[2], cross_cache[0].shape[0], logits))
            return super().decode(decoder_input_ids, encoder_attention_mask, self_cache, cross_cache, logits,
                                  cache_rows)

    sources = [translator.tokenizer.encode(s) for s in SENTENCES]
    input_ids, attention_mask = pad_batch(sources, translator.ids.pad)
    beam_search(Recording(translator.model), input_ids, attention_mask, beam=3, max_new_tokens=[12] * len(sources),
                ids=translator.ids)
    assert [shape[1] for shape, *_ in calls] == [1] * len(calls)
    assert [past for _, past, _, _ in calls] == list(range(len(calls)))
    rows = [shape[0] for shape, *_ in calls]
    sentences = [n for _, _, n, _ in calls]
    # The first step decodes one row per sentence (its beams would start alike), every later one 3.
    assert rows[0] == len(sources) and rows[1] == 3 * len(sources) and rows[1:] == sorted(rows[1:], reverse=True)
    # The cross cache stays one per sentence (not per beam); the logits are never copied out while searching.
    assert [rows[0], *(r // 3 for r in rows[1:])] == sentences
    assert not any(wants_logits for *_, wants_logits in calls)


@pytest.mark.parametrize("beam", [1, 3, 20])
def test_the_decoders_candidates_give_the_search_the_same_result_as_the_logits(translator, beam):
    class LogitsOnly(OnnxSeq2Seq):
        """The same graphs, without the decoder's next-token candidates."""

        def __init__(self, inner):
            self.__dict__.update(inner.__dict__)

        def decode(self, decoder_input_ids, encoder_attention_mask, self_cache, cross_cache, logits=True,
                   cache_rows=None):
            out = super().decode(decoder_input_ids, encoder_attention_mask, self_cache, cross_cache, logits=True,
                                 cache_rows=cache_rows)
            return dataclasses.replace(out, next_log_probs=None, next_ids=None)

    sources = [translator.tokenizer.encode(s) for s in SENTENCES]
    input_ids, attention_mask = pad_batch(sources, translator.ids.pad)
    limits = [translator.max_new_tokens(len(s)) for s in sources]
    # The graph has 9 candidates a row (for beam 4): beam 20 takes them from the logits in both runs.
    with_candidates = beam_search(translator.model, input_ids, attention_mask, beam=beam, max_new_tokens=limits,
                                  ids=translator.ids)
    from_logits = beam_search(LogitsOnly(translator.model), input_ids, attention_mask, beam=beam,
                              max_new_tokens=limits, ids=translator.ids)
    assert with_candidates == from_logits


# --------------------------------------------------------------------------------------------------- the translator


def test_line_order_is_kept_and_a_translation_does_not_depend_on_its_batch(export_dir, translator):
    lines = SENTENCES + ["Two dogs."]
    together = translator.translate(lines, beam=2)
    # A small token budget splits the input into many batches of different sentences.
    small_batches = Translator(export_dir, max_tokens=40).translate(lines, beam=2)
    # One thread decoding the batches one after another, and three decoding them at once.
    one_thread = Translator(export_dir, max_tokens=40, threads=1).translate(lines, beam=2)
    three_threads = Translator(export_dir, max_tokens=40, threads=3).translate(lines, beam=2)
    alone = [translator.translate([line], beam=2)[0] for line in lines]
    assert together == small_batches == one_thread == three_threads == alone
    assert together[1] == together[-1]
    assert len(set(together)) > 1


def test_empty_and_blank_lines_give_empty_lines(translator):
    out = translator.translate(["", "Two dogs.", "   ", "\t", "People sit outside.", ""], beam=2)
    assert len(out) == 6
    assert [out[i] for i in (0, 2, 3, 5)] == ["", "", "", ""]
    assert out[1] and out[4]
    assert translator.translate([]) == []


def test_a_line_longer_than_the_model_takes_is_truncated_with_a_warning_naming_it(export_dir, caplog):
    translator = Translator(export_dir, max_input_tokens=8)
    long_line = "A man in a blue shirt is standing on a ladder cleaning windows."
    with caplog.at_level(logging.WARNING, logger="mtpipe.translate"):
        out = translator.translate(["Two dogs.", long_line], beam=2)
    assert "line 2:" in caplog.text and "translating its first 8" in caplog.text
    assert "line 1:" not in caplog.text
    truncated = translator.tokenizer.encode(long_line)[:7] + [translator.tokenizer.eos_id]
    expected = translator.translate_ids([truncated], beam=2)[0]
    assert out[1] == translator.tokenizer.decode(expected)


def test_non_utf8_input_is_an_error_naming_the_line():
    assert read_lines(io.BytesIO("one\r\ntwo ☃\n\nfour".encode())) == ["one", "two ☃", "", "four"]
    with pytest.raises(InputFileError, match=r"<stdin>, line 3: not valid UTF-8 \(byte 0xe9 at byte 10 of the line"):
        read_lines(io.BytesIO(b"fine\nstill fine\ncaf\xc3\xa9 caf\xe9\nlater\n"))


def test_int8_graphs_translate_too(export_dir):
    out = Translator(export_dir, int8=True).translate(["Two dogs.", "", "People sit outside."], beam=2)
    assert out[0] and out[1] == "" and out[2]


def test_an_export_without_the_kv_cached_decoder_is_a_clear_error(export_dir, tmp_path):
    old = tmp_path / "old_export"
    shutil.copytree(export_dir, old)
    manifest = json.loads((old / "export.json").read_text())
    (old / "export.json").write_text(json.dumps({**manifest, "kv_cache": False}))
    with pytest.raises(ExportDirError, match="without a KV-cached ONNX decoder"):
        Translator(old)
    with pytest.raises(ExportDirError, match=r"export\.json not found"):
        Translator(tmp_path)


def test_an_export_of_an_older_format_version_is_refused_with_export_it_again(export_dir, tmp_path):
    old = tmp_path / "version_3"
    shutil.copytree(export_dir, old)
    manifest = json.loads((old / "export.json").read_text())
    generation = manifest["generation"]
    # Version 3 wrote the length rule twice: in `generation` and in a `max_len` block.
    manifest.update(version=3, max_len={"a": generation["max_len_a"], "b": generation["max_len_b"]})
    (old / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportDirError, match=r"export\.json is export format version 3, this code reads version 7: "
                                             r"export it again"):
        Translator(old)


def test_the_translator_takes_its_length_rule_from_the_manifest(export_dir, tmp_path, translator):
    changed = tmp_path / "short_outputs"
    shutil.copytree(export_dir, changed)
    manifest = json.loads((changed / "export.json").read_text())
    manifest["generation"].update(max_len_a=0.0, max_len_b=3)
    (changed / "export.json").write_text(json.dumps(manifest))
    short = Translator(changed)
    sources = [short.tokenizer.encode(s) for s in SENTENCES]
    # The untrained model never ends on its own: every output is as long as the rule allows.
    assert [len(h) for h in short.translate_ids(sources, beam=2)] == [3] * len(SENTENCES)
    assert translator.max_new_tokens(10) == 22 and short.max_new_tokens(10) == 3


# --------------------------------------------------------------------------------------------------- directions


@pytest.fixture(scope="module")
def two_targets(two_target_exported) -> Translator:
    return Translator(two_target_exported.export)


def test_a_one_direction_model_needs_no_target_and_refuses_another(translator):
    assert translator.directions.names == ["en-de"]
    assert translator.direction() == translator.direction("de", "en") == Direction("en", "de")
    lines = ["Two dogs.", "People sit outside."]
    assert translator.translate(lines, beam=2, tgt="de") == translator.translate(lines, beam=2)
    with pytest.raises(UnknownDirection, match=r"target 'fr' is not one of this model's targets: de "
                                               r"\(directions: en-de\)"):
        translator.translate(lines, tgt="fr")


def test_a_two_target_model_reads_each_source_with_its_targets_tag_first(two_target_exported, two_targets):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(two_target_exported.export)
    assert two_targets.directions.names == ["en-de", "en-fr"]
    for tgt in ("de", "fr"):
        ids = two_targets.encode(SENTENCES, two_targets.direction(tgt))
        assert ids == [tokenizer(f">>{tgt}<< {s}")["input_ids"] for s in SENTENCES]
        assert {row[0] for row in ids} == {tokenizer.convert_tokens_to_ids(f">>{tgt}<<")}


def test_translating_into_a_target_gives_what_pytorch_generates_for_the_tagged_source(two_target_exported,
                                                                                     two_targets):
    import torch

    model, tokenizer = load_model(two_target_exported.final_model)
    for tgt in ("de", "fr"):
        for line in SENTENCES[:3]:
            encoded = tokenizer(f">>{tgt}<< {line}", return_tensors="pt")
            limit = two_targets.max_new_tokens(encoded["input_ids"].shape[1])
            with torch.no_grad():
                generated = model.generate(**encoded, num_beams=1, do_sample=False, max_length=limit + 1)
            expected = tokenizer.decode(generated[0], skip_special_tokens=True)
            assert two_targets.translate([line], beam=1, tgt=tgt) == [expected], (tgt, line)


@pytest.mark.parametrize(("choice", "message"), [
    ({}, "this model translates into de, fr: name the target language (directions: en-de, en-fr)"),
    ({"tgt": "cs"}, "target 'cs' is not one of this model's targets: de, fr (directions: en-de, en-fr)"),
    ({"tgt": "fr", "src": "de"}, "this model does not translate de-fr; its directions: en-de, en-fr"),
])
def test_a_missing_or_unknown_choice_of_direction_is_an_error_listing_the_models_targets(two_targets, choice,
                                                                                         message):
    with pytest.raises(UnknownDirection) as caught:
        two_targets.translate(["Two dogs."], **choice)
    assert str(caught.value) == message


def test_an_export_whose_languages_file_is_missing_or_disagrees_with_its_checkpoint_is_refused(export_dir, tmp_path):
    missing = tmp_path / "no_languages"
    shutil.copytree(export_dir, missing)
    (missing / "languages.json").unlink()
    with pytest.raises(ExportDirError, match=r"languages\.json: not found .*export it again"):
        Translator(missing)
    other = tmp_path / "other_languages"
    shutil.copytree(export_dir, other)
    recorded = json.loads((other / "languages.json").read_text())
    (other / "languages.json").write_text(json.dumps({**recorded, "family": "mbart50"}))
    with pytest.raises(ExportDirError, match=r"languages\.json: family 'mbart50', but the checkpoint beside it is a "
                                             r"marian one.*export it again"):
        Translator(other)


# --------------------------------------------------------------------------------------------------- the CLI


def run_cli(export_dir: Path, stdin: bytes, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "translate", "--model", str(export_dir), *args],
                          cwd=REPO, input=stdin, capture_output=True)


def test_cli_translates_stdin_to_stdout_line_for_line(export_dir, translator):
    lines = ["Two dogs.", "", "A woman with a large purse is walking by a gate.", "Hello"]
    result = run_cli(export_dir, "\n".join(lines).encode() + b"\n", "--beam", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode("utf-8").split("\n") == [*translator.translate(lines, beam=2), ""]


def test_cli_names_the_line_of_invalid_utf8_and_exits_1(export_dir):
    result = run_cli(export_dir, b"Two dogs.\n\xff\xfe\n", "--beam", "2")
    assert result.returncode == 1
    assert result.stdout == b""
    assert "line 2: not valid UTF-8" in result.stderr.decode()


def test_cli_translates_into_the_target_named_by_tgt(two_target_exported, two_targets):
    lines = ["Two dogs.", "", "Hello"]
    for tgt in ("de", "fr"):
        result = run_cli(two_target_exported.export, "\n".join(lines).encode() + b"\n", "--beam", "2", "--tgt", tgt,
                         "--src", "en")
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode("utf-8").split("\n") == [*two_targets.translate(lines, beam=2, tgt=tgt), ""]


@pytest.mark.parametrize(("args", "message"), [
    ((), "this model translates into de, fr: name the target language (directions: en-de, en-fr) (--tgt, --src)"),
    (("--tgt", "cs"), "target 'cs' is not one of this model's targets: de, fr"),
])
def test_cli_without_a_target_or_with_an_unknown_one_exits_2_listing_the_targets(two_target_exported, args,
                                                                                 message):
    result = run_cli(two_target_exported.export, b"Two dogs.\n", *args)
    assert result.returncode == 2
    assert result.stdout == b""
    assert message in result.stderr.decode()
