"""The evaluate stage on pretrained multilingual checkpoints: every translation is generated after the direction's
decoder prefix (mBART-50, M2M-100, NLLB: </s> then the target's language code; mBART cc25: the code), the sources
are the direction's layout around the text's pieces (the tokenizer's own ids with src_lang set), greedy
translations equal transformers' own `generate` with the target forced its way, and a one-direction Marian is
decoded as plain `generate` decodes it (the scratch path unchanged).

The checkpoints are the tiny random ones of tests/support/tiny_checkpoints.py, with the `languages.json` the tokenize
stage writes for them (its layouts measured on the tokenizer by stages/tokenize/checkpoint_tokenizer.py); the untrained
models never end a sentence on their own, so every translation runs to its length limit and exercises it.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from pipeline.runtime.decoding import output_limit
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import FAMILIES, Family
from pipeline.runtime.languages import Direction, Directions
from pipeline.runtime.model_languages import LANGUAGES_FILE, DirectionLayout, ModelLanguages
from stages import evaluate
from stages.tokenize.checkpoint_tokenizer import measure_layout, set_direction
from tests.conftest import write_clean_splits

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("torch_on_one_thread")]

DIRECTIONS = ("en-de", "en-fr")
ROWS = 5  # per direction of the test split
EVALUATE = {"evaluate": {"beam": 2, "max_len_b": 4}}
CODES = {
    "mbart50": {"en": "en_XX", "de": "de_DE", "fr": "fr_XX"},
    "mbart": {"en": "en_XX", "de": "de_DE", "fr": "fr_XX"},
    "m2m100": {"en": "__en__", "de": "__de__", "fr": "__fr__"},
    "nllb": {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn"},
    "marian-multi": {"de": ">>deu<<", "fr": ">>fra<<"},
}
SENTENCES = ["Two dogs.", "A woman in a red coat rides her bike down a long and busy street.", "Hi",
             "The children play football in the park after school."]


def family_of(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name.removesuffix("-multi"))


def set_languages(tokenizer, family: str, direction: Direction) -> str:
    """The tokenizer set to the direction as the tokenize stage sets it; returns the text in front of a source
    (Marian's tag)."""
    return set_direction(tokenizer, family_of(family), direction, CODES[family])


def final_model(checkpoint: Path, root: Path, family: str) -> Path:
    """`root`/models/final: the checkpoint with the languages.json the tokenize stage measures and train ships."""
    from transformers import AutoConfig, AutoTokenizer

    final = Paths(root).final_model
    shutil.copytree(checkpoint, final)
    tokenizer, config = AutoTokenizer.from_pretrained(final), AutoConfig.from_pretrained(final)
    directions = Directions.of(DIRECTIONS)
    layouts = {str(d): measure_layout(tokenizer, family_of(family), config, d, CODES[family], str(final))
               for d in directions.directions}
    ModelLanguages(directions, family_of(family), CODES[family], layouts).write(final)
    return final


def expected_start(tokenizer, family: str, tgt: str) -> list[int]:
    """What every generated row of a direction must begin with."""
    code = tokenizer.convert_tokens_to_ids(CODES[family][tgt])
    if family == "mbart":
        return [code]
    if family == "marian-multi":
        return [tokenizer.pad_token_id]
    return [tokenizer.eos_token_id, code]


@pytest.fixture(scope="module", params=["mbart50", "m2m100", "nllb", "mbart"])
def evaluated(request, tiny_checkpoint, tmp_path_factory):
    """The stage run on a two-direction test split, recording every row `generate` gave back, by the direction
    being evaluated (known from the test split, not from the model's languages file)."""
    family = request.param
    root = tmp_path_factory.mktemp(f"evaluate_{family}")
    final_model(tiny_checkpoint(family), root, family)
    write_clean_splits(root, {"test": ROWS}, DIRECTIONS)
    generated: dict[str, list[list[int]]] = defaultdict(list)
    current: list[str] = []
    real_load, real_evaluate_direction = evaluate.load_model, evaluate.evaluate_direction

    def load_recording(model_dir):
        model, tokenizer = real_load(model_dir)
        real_generate = model.generate

        def generate(*args, **kwargs):
            out = real_generate(*args, **kwargs)
            generated[current[-1]] += out.tolist()
            return out

        model.generate = generate
        return model, tokenizer

    def evaluate_direction(model, tokenizer, layout, test_set, direction, pairs, cfg):
        current.append(str(direction))
        return real_evaluate_direction(model, tokenizer, layout, test_set, direction, pairs, cfg)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "load_model", load_recording)
        patch.setattr(evaluate, "evaluate_direction", evaluate_direction)
        evaluate.run(parse(EVALUATE), Paths(root))
    return family, Paths(root), generated


def test_every_translation_is_generated_after_the_start_token_and_its_targets_language_code(evaluated):
    from transformers import AutoTokenizer

    family, paths, generated = evaluated
    tokenizer = AutoTokenizer.from_pretrained(paths.final_model)
    assert sorted(generated) == sorted(DIRECTIONS)
    shares = {}
    for direction, rows in generated.items():
        start = expected_start(tokenizer, family, direction.split("-")[1])
        shares[direction] = sum(row[: len(start)] == start for row in rows) / len(rows)
        assert len(rows) == ROWS
    print(f"{family}: share of translations starting with {'</s> + ' if family != 'mbart' else ''}the target's "
          f"code: {shares}")
    assert shares == {direction: 1.0 for direction in DIRECTIONS}
    for direction in DIRECTIONS:
        hyps = (paths.eval_dir / f"test.{direction}.hyp.txt").read_text(encoding="utf-8").splitlines()
        assert len(hyps) == ROWS


def test_the_sources_are_the_tokenizers_own_ids_with_the_directions_languages_set(tiny_checkpoint, tmp_path):
    from transformers import AutoTokenizer

    for family in ("mbart50", "m2m100", "nllb", "mbart", "marian-multi"):
        final = final_model(tiny_checkpoint(family), tmp_path / family, family)
        tokenizer, languages = AutoTokenizer.from_pretrained(final), ModelLanguages.read(final)
        for direction in languages.directions.directions:
            lead = set_languages(tokenizer, family, direction)
            layout = languages.layout(direction)
            for text in SENTENCES:
                pieces = tokenizer(text, add_special_tokens=False).input_ids
                assert layout.source(pieces) == tokenizer(lead + text).input_ids, (family, direction)


def transformers_own(model, tokenizer, family: str, direction: Direction, text: str, limit: int) -> str:
    """One sentence translated by transformers' `generate` with the target forced as the family's model card
    shows it (forced_bos_token_id; mBART cc25: decoder_start_token_id; Marian: the tag in the text), greedy, the
    same length limit and no <pad>."""
    import torch

    lead, tgt = set_languages(tokenizer, family, direction), direction.tgt
    code = tokenizer.convert_tokens_to_ids(CODES[family][tgt])
    start = {"mbart": {"decoder_start_token_id": code}, "marian-multi": {}}.get(family, {"forced_bos_token_id": code})
    prefix_length = 2 if "forced_bos_token_id" in start else 1
    encoded = tokenizer([lead + text], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**encoded, **start, num_beams=1, do_sample=False, max_length=prefix_length + limit,
                             forced_eos_token_id=tokenizer.eos_token_id, bad_words_ids=[[tokenizer.pad_token_id]])
    assert out[0, :prefix_length].tolist() == expected_start(tokenizer, family, tgt)
    return tokenizer.decode(out[0], skip_special_tokens=True)


@pytest.mark.parametrize("family", ["mbart50", "m2m100", "nllb", "mbart", "marian-multi"])
def test_greedy_translations_equal_transformers_own_generate_with_the_target_forced(family, tiny_checkpoint,
                                                                                      tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    final = final_model(tiny_checkpoint(family), tmp_path, family)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(final).eval(), AutoTokenizer.from_pretrained(final)
    languages = ModelLanguages.read(final)
    cfg = parse({"evaluate": {"beam": 1, "max_len_b": 4}}).evaluate
    for direction in languages.directions.directions:
        ours = evaluate.translate(model, tokenizer, languages.layout(direction), SENTENCES, cfg, progress_bar=False)
        lead = set_languages(tokenizer, family, direction)
        theirs = []
        for text in SENTENCES:
            source_length = len(tokenizer(lead + text).input_ids)
            limit = output_limit(source_length, cfg.max_len_a, cfg.max_len_b, model.config.max_position_embeddings)
            theirs.append(transformers_own(model, tokenizer, family, direction, text, limit))
        assert ours == theirs, (family, direction)


def test_a_one_direction_marian_decodes_as_plain_generate_from_its_pad_start(tiny_checkpoint):
    """The scratch layout (no tag, </s> after the pieces, decoding from <pad>): beam search with each sentence's
    own limit is what `generate` gives that sentence alone, as the stage gave before decoder prefixes."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    checkpoint = tiny_checkpoint("marian")
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    layout = DirectionLayout((), (eos,), (), (eos,), pad)
    assert layout.decoder_prefix == (model.config.decoder_start_token_id,)
    cfg = parse({"evaluate": {"beam": 2, "max_len_b": 4}}).evaluate
    ours = evaluate.translate(model, tokenizer, layout, SENTENCES, cfg, progress_bar=False)
    plain = []
    for text in SENTENCES:
        encoded = tokenizer([text], return_tensors="pt")
        limit = output_limit(encoded.input_ids.shape[1], cfg.max_len_a, cfg.max_len_b,
                             model.config.max_position_embeddings)
        with torch.inference_mode():
            out = model.generate(**encoded, num_beams=cfg.beam, length_penalty=cfg.length_penalty,
                                 max_length=limit + 1, early_stopping=True, bad_words_ids=[[pad]], do_sample=False)
        plain.append(tokenizer.decode(out[0], skip_special_tokens=True))
    assert ours == plain


def test_each_limit_counts_the_tokens_after_the_prefix_and_each_row_may_have_its_own_prefix(tiny_checkpoint):
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from pipeline.prefixed_generate import generate_from_prefix
    from pipeline.runtime.decoding import pad_batch

    checkpoint = tiny_checkpoint("mbart50")
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    eos = tokenizer.eos_token_id
    de, fr = tokenizer.convert_tokens_to_ids(["de_DE", "fr_XX"])
    ids, mask = pad_batch(tokenizer(SENTENCES[:2]).input_ids, tokenizer.pad_token_id)
    with torch.inference_mode():
        hyps = generate_from_prefix(model, torch.from_numpy(ids), torch.from_numpy(mask), [(eos, de), (eos, fr)],
                                    [3, 6], eos_id=eos, pad_id=tokenizer.pad_token_id, num_beams=2)
        alone = [generate_from_prefix(model, torch.from_numpy(ids[i : i + 1]), torch.from_numpy(mask[i : i + 1]),
                                      (eos, code), [limit], eos_id=eos, pad_id=tokenizer.pad_token_id, num_beams=2)[0]
                 for i, (code, limit) in enumerate([(de, 3), (fr, 6)])]
    # The untrained model never ends on its own: each row runs to its limit, </s> included, after the prefix.
    assert [len(h) for h in hyps] == [3, 6] and all(h[-1] == eos and eos not in h[:-1] for h in hyps)
    assert hyps == alone


def test_a_languages_file_without_layouts_names_the_file_and_the_stage_to_rerun(tmp_path, monkeypatch):
    paths = Paths(tmp_path)
    paths.final_model.mkdir(parents=True)
    (paths.final_model / "config.json").write_text(json.dumps({"model_type": "marian"}))
    # As written before layouts were recorded.
    (paths.final_model / "languages.json").write_text('{"directions": ["en-de"], "target_tags": false}')
    write_clean_splits(tmp_path, {"test": 2}, ("en-de",))
    monkeypatch.setattr(evaluate, "load_model", lambda _: pytest.fail("the model was loaded"))
    with pytest.raises(PipelineError, match=f"{LANGUAGES_FILE}.*rerun the pipeline from tokenize"):
        evaluate.run(parse({}), paths)


def test_a_checkpoints_own_generation_settings_do_not_change_its_translations(tiny_checkpoint, tmp_path):
    """Published generation configs set beams, lengths and forced tokens of their own (OPUS-MT: 4 beams): the
    stage's settings and the direction's prefix decide. mBART cc25's one-token prefix is where a forced BOS
    would land on the first translated token."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    final = final_model(tiny_checkpoint("mbart"), tmp_path, "mbart")
    tokenizer, layout = AutoTokenizer.from_pretrained(final), ModelLanguages.read(final).layout("en-de")
    cfg = parse({"evaluate": {"beam": 2, "max_len_b": 4}}).evaluate
    model = AutoModelForSeq2SeqLM.from_pretrained(final).eval()
    plain = evaluate.translate(model, tokenizer, layout, SENTENCES, cfg, progress_bar=False)
    settings = model.generation_config
    settings.num_beams, settings.max_new_tokens, settings.length_penalty = 4, 2, 3.0
    settings.forced_bos_token_id = tokenizer.convert_tokens_to_ids("en_XX")
    assert evaluate.translate(model, tokenizer, layout, SENTENCES, cfg, progress_bar=False) == plain
