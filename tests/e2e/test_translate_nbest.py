"""The beam's n-best list (pipeline.runtime.beam_search.beam_search_nbest), which the service's `alternatives` come
from: it is transformers' `generate(num_return_sequences=beam)`, its first hypothesis is the translation, and the
service's engine hands the others back as text only when asked.

On an fp32 export of the sharpened tiny model (outputs garbage, but decisive: tests/support/export_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.runtime.beam_search import beam_search, beam_search_nbest
from pipeline.runtime.decoding import one_line, pad_batch
from pipeline.runtime.serve.engine import Translation, TranslationEngine, alternatives_of
from pipeline.runtime.serve.settings import ServeSettings
from pipeline.runtime.translate import Translator
from tests.support.export_helpers import load_model, one_torch_thread

pytestmark = pytest.mark.e2e

SENTENCES = ["A man in a blue shirt is standing on a ladder.", "Two dogs.", "People sit outside."]


@pytest.fixture(scope="module")
def paths(fp32_exported):
    """The services' export (tests/e2e/conftest.py), only read here."""
    return fp32_exported


@pytest.fixture(scope="module")
def translator(paths) -> Translator:
    return Translator(paths.export, threads=1)


def test_the_n_best_list_is_transformers_num_return_sequences_best_first(paths, translator):
    import torch

    beam = 4
    model, tokenizer = load_model(paths.final_model)
    sources = [tokenizer(s)["input_ids"] for s in SENTENCES]
    input_ids, attention_mask = pad_batch(sources, translator.ids.pad)
    # generate has one length limit per batch; give the ONNX search the same one for every sentence.
    limit = translator.max_new_tokens(input_ids.shape[1])
    with one_torch_thread(), torch.no_grad():
        generated = model.generate(input_ids=torch.from_numpy(input_ids),
                                   attention_mask=torch.from_numpy(attention_mask), num_beams=beam,
                                   num_return_sequences=beam, max_length=limit + 1, early_stopping=True,
                                   length_penalty=1.0, do_sample=False)
    rows = [[t for t in row[1:].tolist() if t != translator.ids.pad] for row in generated]
    ours = beam_search_nbest(translator.model, input_ids, attention_mask, beam=beam,
                             max_new_tokens=[limit] * len(sources), ids=translator.ids, length_penalty=1.0)
    assert ours == [rows[i * beam : (i + 1) * beam] for i in range(len(SENTENCES))]
    assert [nbest[0] for nbest in ours] == beam_search(translator.model, input_ids, attention_mask, beam=beam,
                                                       max_new_tokens=[limit] * len(sources), ids=translator.ids)


def test_the_translators_n_best_lists_start_with_its_translations(translator):
    direction = translator.direction()
    sources = [translator.source_ids(s, direction) for s in SENTENCES]
    nbest = translator.hypotheses_ids(sources, beam=3)
    assert [len(hypotheses) for hypotheses in nbest] == [3] * len(SENTENCES)
    assert [hypotheses[0] for hypotheses in nbest] == translator.translate_ids(sources, beam=3)
    assert all(len(set(map(tuple, hypotheses))) == 3 for hypotheses in nbest)  # three different hypotheses


def test_the_engine_gives_the_best_as_the_translation_and_the_others_as_alternatives(paths, translator):
    engine = TranslationEngine.load(ServeSettings(model_dir=paths.export, beam=3))
    direction = translator.direction()
    sources = [engine.source_ids(s, direction) for s in SENTENCES]
    translations = engine.translate(sources, direction.tgt)
    assert translations == translator.translate(SENTENCES, beam=3)
    decode = translator.tokenizer.decode
    for translation, nbest in zip(translations, translator.hypotheses_ids(sources, beam=3), strict=True):
        assert isinstance(translation, Translation)
        assert alternatives_of(translation) == [one_line(decode(ids)) for ids in nbest[1:]]
    assert alternatives_of("") == []
    assert Path(engine.model_dir) == paths.export
