"""export.shortlist: the lexical shortlist built from the training pairs, the shortlisted decoder graphs (fp32 and
int8), their figures in metrics/export.json, and the Translator decoding with them (pipeline/runtime/shortlist.py).

The export is the sharpened tiny model (tests/support/export_helpers.py): its outputs are garbage but decisive, so
a shortlist that holds the whole vocabulary must give exactly the full decoder's translations, and a real one must
keep every token inside each sentence's list.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pipeline.runtime.export_format import ExportDirError, ExportManifest, ShortlistFiles
from pipeline.runtime.shortlist import Shortlist
from pipeline.runtime.translate import BatchShortlist, OnnxSeq2Seq, Translator
from tests.support.export_helpers import SENTENCES, export_params, one_torch_thread

pytestmark = pytest.mark.e2e



@pytest.fixture(scope="module")
def shortlisted(make_sharpened_root):
    """(paths, metrics) of one export with int8 and a shortlist of 5 candidates per source token and 20 always."""
    from stages import export

    paths = make_sharpened_root()
    with one_torch_thread():
        export.run(export_params(int8=True, torchscript=False, ctranslate2=False, shortlist=True,
                                 shortlist_per_source=5, shortlist_frequent=20), paths)
    return paths, json.loads(paths.metrics("export").read_text())


def with_table(translator: Translator, table: Shortlist) -> Translator:
    """The translator with its shortlisted decoder fed another table."""
    translator.model.shortlist = dataclasses.replace(translator.model.shortlist, table=table)
    return translator


def test_the_manifest_lists_the_shortlist_and_its_graphs(shortlisted):
    paths, metrics = shortlisted
    manifest = ExportManifest.read(paths.export)
    assert manifest.shortlisted_decoder() == ShortlistFiles("shortlist.npz", "shortlist_projection.npz", "onnx",
                                                            "decoder.shortlist.onnx")
    assert manifest.shortlisted_decoder(int8=True) == ShortlistFiles(
        "shortlist.npz", "shortlist_projection.npz", "onnx_int8", "decoder.shortlist.int8.onnx")
    for name in ("shortlist.npz", "shortlist_projection.npz", "decoder.shortlist.onnx", "decoder.shortlist.int8.onnx"):
        assert (paths.export / name).is_file(), name
    table = Shortlist.read(paths.export / "shortlist.npz")
    assert table.by_source.shape[1] == 5
    figures = metrics["shortlist"]
    assert figures["per_source"] == 5 and figures["always"] == table.always.size <= 21
    assert figures["training_pairs"] == 2000
    for precision in ("onnx", "onnx_int8"):
        assert 0 <= figures[precision]["identical_share"] <= 1
        assert figures[precision]["bleu_delta"] == pytest.approx(
            figures[precision]["bleu"] - figures[precision]["bleu_full"], abs=0.011)
    assert 20 <= figures["mean_width"] < 1000
    assert manifest.parity["shortlist"] == figures
    written = json.loads((paths.export / "export.json").read_text())
    assert written["inputs"]["onnx"]["decoder_shortlist"][3:5] == ["shortlist", "shortlist_projection"]
    assert "logits" not in written["outputs"]["onnx"]["decoder_shortlist"]


@pytest.mark.parametrize("int8", [False, True])
def test_a_shortlist_of_the_whole_vocabulary_translates_as_the_full_decoder(shortlisted, int8):
    paths, _ = shortlisted
    full = Translator(paths.export, int8=int8, threads=1, shortlist=False)
    assert full.model.shortlist is None
    everything = Translator(paths.export, int8=int8, threads=1)
    vocab = everything.manifest.vocab_size
    with_table(everything, Shortlist(by_source=np.full((vocab, 1), -1), always=np.arange(vocab)))
    assert everything.translate(SENTENCES, beam=4) == full.translate(SENTENCES, beam=4)


def test_every_token_comes_from_its_sentences_shortlist(shortlisted):
    paths, _ = shortlisted
    translator = Translator(paths.export, threads=1)
    shortlist = translator.model.shortlist
    assert isinstance(shortlist, BatchShortlist)
    sources = translator.encode(SENTENCES)
    hyps = translator.translate_ids(sources, beam=4)
    full = Translator(paths.export, threads=1, shortlist=False).translate_ids(sources, beam=4)
    assert hyps != full  # 25-odd of 1000 pieces per sentence: the garbage model's choices do change
    for source, hyp in zip(sources, hyps, strict=True):
        ids = np.asarray([source])
        allowed = set(shortlist.table.for_batch(ids, np.ones_like(ids), shortlist.pad_id, 1)[0].tolist())
        assert set(hyp) <= allowed


def test_a_sentences_translation_does_not_depend_on_its_batch(shortlisted):
    paths, _ = shortlisted
    translator = Translator(paths.export, threads=1)
    together = translator.translate(SENTENCES, beam=4)
    assert [translator.translate([s], beam=4)[0] for s in SENTENCES] == together


def test_a_beam_wider_than_the_graphs_candidates_decodes_without_the_shortlist(shortlisted, caplog):
    paths, _ = shortlisted
    translator = Translator(paths.export, threads=1)
    full = Translator(paths.export, threads=1, shortlist=False)
    with caplog.at_level("INFO", logger="mtpipe.translate"):
        assert translator.translate(SENTENCES[:2], beam=6) == full.translate(SENTENCES[:2], beam=6)
    assert "decoding without the shortlist" in caplog.text


def test_a_shortlisted_decoder_refuses_to_give_logits(shortlisted):
    paths, _ = shortlisted
    model = Translator(paths.export, threads=1).model
    assert isinstance(model, OnnxSeq2Seq) and model.shortlist is not None
    ids = np.asarray([[5, 6, 0]])
    _, cross = model.encode(ids, np.ones_like(ids))
    with pytest.raises(ValueError, match="not logits"):
        model.decode(np.asarray([[model.shortlist.pad_id]]), np.ones_like(ids), model.empty_cache(1), cross)


def test_a_shortlisted_decoder_of_the_earlier_format_is_refused_with_what_to_do(shortlisted, tmp_path):
    """An export from before the shortlisted decoder took its projection columns as an input (no projection file):
    its graph would be fed inputs it does not have, so it must be exported again; without the shortlist it decodes."""
    import shutil

    paths, _ = shortlisted
    earlier = tmp_path / "export"
    shutil.copytree(paths.export, earlier)
    manifest = json.loads((earlier / "export.json").read_text())
    del manifest["files"]["shortlist"]["projection"]
    (earlier / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportDirError, match=r"decoder.shortlist.onnx\) is of an earlier version: export it again"):
        Translator(earlier, threads=1)
    assert Translator(earlier, threads=1, shortlist=False).translate(SENTENCES[:1], beam=4)


def test_an_export_without_a_shortlist_decodes_with_the_full_decoder(export_dir):
    assert ExportManifest.read(export_dir).shortlisted_decoder() is None
    assert Translator(export_dir, threads=1).model.shortlist is None


def test_the_decode_benches_measure_the_shortlisted_paths(shortlisted):
    import subprocess
    import sys

    from tests.conftest import MULTI30K, REPO

    if not (MULTI30K / "test_2016_flickr.en.gz").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    paths, _ = shortlisted
    env = {"HF_HUB_OFFLINE": "1", "PATH": ""}
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "decode.py"), "--model", str(paths.final_model), "--export",
         str(paths.export), "--student", str(paths.export), "--limit", "4", "--skip", "onnx-1x2", "ctranslate2"],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"onnx-int8-shortlist", "student-int8", "student-int8-shortlist"} <= set(figures["paths"])
    assert "student_int8_at_least_3x_teacher_int8_shortlist" in figures["goals"]
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "decode_profile.py"), "--export", str(paths.export), "--int8",
         "--shortlist", "--limit", "4"],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["exports"][0]["decoder"]["runs"] >= 1


def test_a_hub_laid_out_nllb_checkpoint_gets_a_shortlist_in_its_own_tokens(tmp_path):
    """A fine-tuned NLLB checkpoint (tokenizer.json, language codes before the text): the table is built with its
    own tokenizer, and a shortlist of its whole vocabulary translates each direction as its full decoder does."""
    from stages import export
    from tests.support.fine_tuned import family_root

    paths = family_root("nllb", tmp_path, {"train": 200, "valid": 8, "test": 8}, ("en-de", "en-fr"))
    with one_torch_thread():
        export.run(export_params(int8=False, torchscript=False, ctranslate2=False, shortlist=True,
                                 shortlist_per_source=5, shortlist_frequent=20), paths)
    figures = json.loads(paths.metrics("export").read_text())["shortlist"]
    assert figures["training_pairs"] == 400 and "onnx" in figures
    shortlisted, full = Translator(paths.export, threads=1), Translator(paths.export, threads=1, shortlist=False)
    assert shortlisted.model.shortlist is not None
    vocab = shortlisted.manifest.vocab_size
    with_table(shortlisted, Shortlist(by_source=np.full((vocab, 1), -1), always=np.arange(vocab)))
    for tgt in ("de", "fr"):
        assert shortlisted.translate(SENTENCES[:3], beam=4, tgt=tgt) == full.translate(SENTENCES[:3], beam=4, tgt=tgt)
