"""A model trained with `tokenize.joint: false` (one SentencePiece model and vocabulary a side: the source's in
vocab.json, the target's in target_vocab.json, the same ids naming different pieces) through the export stage:
`mtpipe translate` gives the text the evaluate stage gives (the target's pieces, not the source's at the same ids),
and the CTranslate2 model holds both vocabularies, so its outputs are target pieces that a user decodes with
target.spm, and its gate compares the right ids.
"""

from __future__ import annotations

import json

import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from tests.conftest import write_clean_splits
from tests.support.export_helpers import (
    CTRANSLATE2_INSTALLED,
    EMBEDDING_SCALE,
    SENTENCES,
    export_params,
    load_model,
    one_torch_thread,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Paths:
    """A tiny untrained model over separate vocabularies, sharpened (tests/support/export_helpers.py), exported
    with the ONNX graphs and, where installed, CTranslate2."""
    import torch

    from stages import export, tokenize
    from stages.train.model import build_model
    from stages.train.save import save_final

    root = tmp_path_factory.mktemp("separate")
    write_clean_splits(root, {"train": 2000, "valid": 16, "test": 16})
    params = parse({"tokenize": {"vocab_size": 600, "joint": False, "threads": 1}, "model": {"preset": "tiny"}})
    paths = Paths(root)
    tokenize.run(params, paths)
    meta = json.loads((paths.tokenized / "meta.json").read_text())
    model = build_model(params.model, meta["vocab_size"], meta["pad_id"], meta["eos_id"], joint_vocab=False)
    with torch.no_grad():
        for embedding in {id(m): m for m in (model.get_encoder().embed_tokens, model.get_decoder().embed_tokens)
                          }.values():
            embedding.weight.mul_(EMBEDDING_SCALE)
    save_final(model, paths.tokenized / "hf_tokenizer", paths.final_model)
    with one_torch_thread():
        export.run(export_params(int8=False, torchscript=False, ctranslate2=CTRANSLATE2_INSTALLED,
                                 parity_sentences=16), paths)
    return paths


def test_the_translator_gives_the_evaluate_stages_text(exported):
    from pipeline.params import EvaluateParams
    from pipeline.runtime.model_languages import ModelLanguages
    from pipeline.runtime.translate import Translator
    from stages.evaluate import translate

    model, tokenizer = load_model(exported.final_model)
    assert tokenizer.separate_vocabs
    translator = Translator(exported.export, threads=1)
    layout = ModelLanguages.read(exported.final_model).layout(translator.direction())
    ours = translator.translate(SENTENCES, beam=4)
    assert ours == translate(model, tokenizer, layout, SENTENCES, EvaluateParams(beam=4), progress_bar=False)
    # The fixture's premise: the two vocabularies name different pieces, so reading the wrong one shows.
    target_pieces = set(json.loads((exported.final_model / "target_vocab.json").read_text()))
    source_pieces = set(json.loads((exported.final_model / "vocab.json").read_text()))
    assert target_pieces != source_pieces


@pytest.mark.skipif(not CTRANSLATE2_INSTALLED, reason="ctranslate2 is not installed (the `ct2` extra)")
def test_the_ctranslate2_model_reads_sources_and_writes_targets_in_their_own_vocabularies(exported):
    import ctranslate2
    import sentencepiece as spm
    import torch

    model_dir = exported.export / "ctranslate2"
    model, tokenizer = load_model(exported.final_model)
    source_vocab = json.loads((exported.final_model / "vocab.json").read_text())
    target_vocab = json.loads((exported.final_model / "target_vocab.json").read_text())
    # CTranslate2's own files, as a user's code finds them; Marian's <pad> (the last id) is not among them.
    for side, vocab in (("source", source_vocab), ("target", target_vocab)):
        listed = json.loads((model_dir / f"{side}_vocabulary.json").read_text())
        assert listed == sorted(vocab, key=vocab.get)[:-1]
    assert not (model_dir / "shared_vocabulary.json").exists()

    # A user's translation: source pieces from source.spm in, target pieces out, decoded with target.spm.
    source_spm = spm.SentencePieceProcessor(model_file=str(exported.final_model / "source.spm"))
    target_spm = spm.SentencePieceProcessor(model_file=str(exported.final_model / "target.spm"))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", inter_threads=1, intra_threads=1)
    sources = [source_spm.encode(s, out_type=str) + ["</s>"] for s in SENTENCES]
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=20)
    with torch.no_grad():
        generated = model.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), num_beams=1, do_sample=False,
                                   max_new_tokens=20)
    expected = tokenizer.convert_ids_to_tokens([t for t in generated[0, 1:].tolist() if t != 0][:20])
    assert results[0].hypotheses[0][:len(expected)] == expected[:len(results[0].hypotheses[0])]
    assert all(token in target_vocab for r in results for token in r.hypotheses[0])
    assert target_spm.decode(results[0].hypotheses[0]) == tokenizer.convert_tokens_to_string(results[0].hypotheses[0])
