"""CTranslate2 searches what transformers' generate and the runtime search, with the options the export's parity
gate and bench/decode.py give it (stages/export/ctranslate2_model.py search_options): at equal length limits its
beam search finds generate's hypotheses at every length penalty (it divides sum(log p) by the length counting </s>
to that power, as they do), and a model whose first choice is </s> gets an empty translation from both, where
CTranslate2's own default (min_decoding_length 1) would give it a token.

The model is the hub-shaped OPUS-MT checkpoint with redrawn weights and a bias towards </s> in its output layer
(`final_logits_bias`, which OPUS-MT checkpoints carry and CTranslate2 converts), so that some hypotheses end on
their own at lengths the penalty decides between, and some at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.export_helpers import CTRANSLATE2_INSTALLED, SENTENCES, one_torch_thread
from tests.support.fine_tuned import redrawn
from tests.support.tiny_checkpoints import build_tiny

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not CTRANSLATE2_INSTALLED, reason="ctranslate2 is not installed (the `ct2` extra)")]

EOS_BIAS = 3.0  # on the redrawn model: greedy ends two of the sentences at once, one after 2 tokens
OUTPUT_LIMIT = 30  # tokens with the forced </s>: the runtime's output_limit, generate's max_new_tokens
SOURCES = [*SENTENCES, "A dog runs.", "Two men play football in a park.", "Children."]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path]:
    """(the transformers model directory, its float32 CTranslate2 conversion by the export's converter)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from stages.export.ctranslate2_model import convert_ctranslate2

    root = tmp_path_factory.mktemp("ct2_search")
    model_dir = build_tiny("opus-mt", root / "model")
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    redrawn(model)
    with torch.no_grad():
        model.final_logits_bias[0, model.config.eos_token_id] = EOS_BIAS
    model.save_pretrained(model_dir)
    convert_ctranslate2(model_dir, root / "ct2", "float32")
    return model_dir, root / "ct2"


def generate_ids(model_dir: Path, beam: int, length_penalty: float) -> list[list[int]]:
    """transformers' hypotheses (after the decoder start, with </s>), one source at a time."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    out = []
    with one_torch_thread(), torch.no_grad():
        for source in SOURCES:
            ids = model.eval().generate(**tokenizer([source], return_tensors="pt"), num_beams=beam,
                                        length_penalty=length_penalty, max_new_tokens=OUTPUT_LIMIT,
                                        early_stopping=True, min_length=0)[0].tolist()
            out.append([i for i in ids[1:] if i != tokenizer.pad_token_id])
    return out


def ctranslate2_ids(model_dir: Path, ct2_dir: Path, beam: int, length_penalty: float) -> list[list[int]]:
    """CTranslate2's hypotheses with the options of stages/export/ctranslate2_model.py, </s> appended."""
    import ctranslate2
    from transformers import AutoTokenizer

    from stages.export.ctranslate2_model import search_options

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(s).input_ids) for s in SOURCES]
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=1)
    results = translator.translate_batch(tokens, beam_size=beam, length_penalty=length_penalty,
                                         **search_options([], False, OUTPUT_LIMIT, len(tokens)))
    return [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) + [tokenizer.eos_token_id] for r in results]


def test_ctranslate2_beam_search_finds_generates_hypotheses_at_every_length_penalty(converted):
    model_dir, ct2_dir = converted
    lengths = {}
    for length_penalty in (0.0, 1.0, 2.0):
        expected = generate_ids(model_dir, 4, length_penalty)
        assert ctranslate2_ids(model_dir, ct2_dir, 4, length_penalty) == expected, length_penalty
        lengths[length_penalty] = [len(ids) for ids in expected]
    # The penalty decides between lengths here (else the comparison would not test it), and at 0 some
    # translations are empty (only </s>): what min_decoding_length 0 allows.
    assert lengths[0.0] != lengths[1.0] and 1 in lengths[0.0]


def test_the_gates_greedy_outputs_are_empty_where_generates_are(converted):
    import ctranslate2
    from transformers import AutoTokenizer

    from stages.export.ctranslate2_model import greedy_ids

    model_dir, ct2_dir = converted
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=1)
    sources = [tokenizer(s).input_ids for s in SOURCES]
    got = greedy_ids(translator, tokenizer, sources, [], False, OUTPUT_LIMIT, tokenizer.eos_token_id)
    expected = generate_ids(model_dir, 1, 1.0)
    assert got == expected
    assert [tokenizer.eos_token_id] in expected
