"""The export stage on a fine-tuned checkpoint of every family: the ONNX encoder and KV-cached decoder written in the
family's architecture (Marian post-norm with sinusoidal positions; mBART pre-norm with learned positions and a
layernorm_embedding; M2M-100/NLLB pre-norm with positions counted from padding_idx + 1), every runtime decoding
each direction from its decoder prefix, int8 and CTranslate2 included.

Each family's tiny random checkpoint (tests/support/tiny_checkpoints.py) becomes models/final with en-de and en-fr
pairs, its weights redrawn and the languages.json the tokenize stage would write for it (tests/support/fine_tuned.py:
as built, an untrained tied-embedding model repeats the last token it was fed, whatever the source, so outputs
equal across runtimes would prove little). One export per family (module scope) serves every test of that family.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifacts import Paths, read_json
from pipeline.params import parse
from pipeline.runtime.beam_search import beam_search
from pipeline.runtime.decoding import SpecialIds, pad_batch
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.export_format import ExportManifest
from pipeline.runtime.families import UnsupportedCheckpoint, check_local_checkpoint
from pipeline.runtime.languages import Directions
from pipeline.runtime.model_languages import ModelLanguages
from pipeline.runtime.translate import OnnxSeq2Seq
from tests.support.export_helpers import CTRANSLATE2_INSTALLED, one_torch_thread
from tests.support.fine_tuned import family_root as fine_tuned_root
from tests.support.fine_tuned import write_languages

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
    pytest.mark.usefixtures("torch_on_one_thread"),
]

# Every architecture and every way a family places its languages: Marian multi-target (a source tag, start
# <pad>), mBART-cc25 (codes after the text, decoding starts from the target's code), mBART-50, M2M-100 and NLLB
# (codes before the text, decoding starts from </s> then the code). A scratch Marian model is test_export.py's.
FAMILIES = ("marian-multi", "mbart", "mbart50", "m2m100", "nllb")
DIRECTIONS = ("en-de", "en-fr")
PARITY_SENTENCES = 8
MAX_LOGIT_DIFF = 1e-4
# TorchScript (legacy, no cache, the model's own modules traced) is test_export.py's: it adds nothing per family.
FULL_EXPORT = {"int8": True, "torchscript": False, "ctranslate2": CTRANSLATE2_INSTALLED,
               "ctranslate2_quantization": "float32"}


def family_root(family: str, root: Path) -> Paths:
    """`root` as a project after fine-tuning a `family` checkpoint, with en-de and en-fr valid and test pairs."""
    return fine_tuned_root(family, root, {"valid": PARITY_SENTENCES, "test": PARITY_SENTENCES}, DIRECTIONS)


@pytest.fixture(scope="module", params=FAMILIES)
def exported_family(request, tmp_path_factory) -> tuple[str, Paths]:
    """(family, paths) of one export stage run with every format on that family's project root."""
    from stages import export

    family = request.param
    paths = family_root(family, tmp_path_factory.mktemp(f"export_{family}"))
    with one_torch_thread():
        export.run(parse({"export": {"parity_sentences": PARITY_SENTENCES, **FULL_EXPORT}}), paths)
    return family, paths


def loaded(paths: Paths):
    """(model, tokenizer, languages) of models/final."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(paths.final_model).eval()
    return model, AutoTokenizer.from_pretrained(paths.final_model), ModelLanguages.read(paths.final_model)


def direction_batch(tokenizer, languages: ModelLanguages, direction: str, texts: list[str], pad_id: int):
    """(input_ids, attention_mask) of texts read as `direction`'s sources: its layout around their pieces."""
    layout = languages.layout(direction)
    return pad_batch([layout.source(p) for p in tokenizer(texts, add_special_tokens=False)["input_ids"]], pad_id)


SOURCES = ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow.", "A girl reads a book.",
           "People walk down the street at night."]
REFERENCES = {"en-de": ["Ein Mann steht auf einer Leiter.", "Zwei Hunde spielen im Schnee.",
                        "Ein Mädchen liest ein Buch.", "Leute gehen nachts die Straße entlang."],
              "en-fr": ["Un homme est debout sur une échelle.", "Deux chiens jouent dans la neige.",
                        "Une fille lit un livre.", "Des gens marchent dans la rue la nuit."]}


def special_ids(model) -> SpecialIds:
    return SpecialIds(start=0, eos=model.config.eos_token_id, pad=model.config.pad_token_id)


def pytorch_hypotheses(model, ids: np.ndarray, mask: np.ndarray, prefix: tuple[int, ...], limit: int, beam: int
                       ) -> list[list[int]]:
    import torch

    from pipeline.prefixed_generate import generate_from_prefix

    ids_of = special_ids(model)
    with torch.no_grad():
        return generate_from_prefix(model, torch.from_numpy(ids), torch.from_numpy(mask), prefix, limit,
                                    eos_id=ids_of.eos, pad_id=ids_of.pad, num_beams=beam, length_penalty=1.0,
                                    early_stopping=True, bad_words_ids=[[ids_of.pad]],
                                    forced_eos_token_id=ids_of.eos)


# --------------------------------------------------------------------------------------------------- the stage


def test_every_family_passes_the_parity_gate_on_each_direction_and_records_its_family(exported_family):
    family, paths = exported_family
    metrics = read_json(paths.metrics("export"))
    assert list(metrics["directions"]) == list(DIRECTIONS)
    for report in metrics["directions"].values():
        assert report["split"] == "test" and report["n_sentences"] == PARITY_SENTENCES
        assert all(0 <= v <= MAX_LOGIT_DIFF for v in report["onnx"].values())
        assert report["identical_share"] == 1.0 and report["emitted_pad"] is False
        assert report["bleu"]["delta"] == 0.0
        assert 0 <= report["onnx_int8"]["identical_share"] <= 1
    manifest = ExportManifest.read(paths.export)
    assert manifest.version == 7
    languages = ModelLanguages.read(paths.export)
    assert languages.family == check_local_checkpoint(paths.final_model)
    assert tuple(languages.directions.names) == DIRECTIONS
    # Only a Marian model's sources carry a tag token; the others' codes are placed by their layouts.
    assert languages.target_tags is (family == "marian-multi")


def test_the_export_holds_the_languages_with_layouts_and_the_family_s_tokenizer_files(exported_family):
    from transformers import AutoTokenizer

    from pipeline.runtime.text_pieces import TOKENIZER_FILES, text_pieces

    _, paths = exported_family
    manifest = ExportManifest.read(paths.export)
    assert ModelLanguages.read(paths.export) == ModelLanguages.read(paths.final_model)
    family = ModelLanguages.read(paths.export).family.name
    for name in (*TOKENIZER_FILES[family], "tokenizer_config.json", "languages.json"):
        assert name in manifest.model_files and (paths.export / name).is_file(), name
    assert not list(paths.export.glob("*.safetensors"))
    # The runtime tokenizer reads the copied files as the checkpoint's tokenizer reads its own.
    pieces = text_pieces(paths.export, family)
    original = AutoTokenizer.from_pretrained(paths.final_model)
    for text in SOURCES:
        assert pieces.pieces(text) == original(text, add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------------------------------- the graphs


def test_the_onnx_decoder_matches_pytorch_at_once_token_by_token_and_after_a_whole_prefix(exported_family):
    import torch

    _, paths = exported_family
    model, tokenizer, languages = loaded(paths)
    ort = OnnxSeq2Seq(paths.export / "encoder.onnx", paths.export / "decoder.onnx")
    pad = model.config.pad_token_id
    for direction in DIRECTIONS:
        layout = languages.layout(direction)
        ids, mask = direction_batch(tokenizer, languages, direction, SOURCES, pad)
        labels = [[*layout.target_prefix, *p, *layout.target_suffix]
                  for p in tokenizer(text_target=REFERENCES[direction], add_special_tokens=False)["input_ids"]]
        # Teacher forcing as the family's label shift: the decoder start, then the labels without the last.
        decoder_ids, decoder_mask = pad_batch([[layout.decoder_start, *t[:-1]] for t in labels], pad)
        assert (decoder_ids[:, : len(layout.decoder_prefix)] == layout.decoder_prefix).all()
        with torch.no_grad():
            reference = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                              decoder_input_ids=torch.from_numpy(decoder_ids)).logits.numpy()
        keep = decoder_mask.astype(bool)
        hidden, cross = ort.encode(ids, mask)
        at_once = ort.decode(decoder_ids, mask, ort.empty_cache(len(ids)), cross).logits
        assert np.abs(at_once - reference)[keep].max() <= MAX_LOGIT_DIFF
        cache, steps = ort.empty_cache(len(ids)), []
        for t in range(decoder_ids.shape[1]):
            out = ort.decode(decoder_ids[:, t : t + 1], mask, cache, cross)
            cache = out.self_cache
            steps.append(out.logits)
        assert np.abs(np.concatenate(steps, axis=1) - reference)[keep].max() <= MAX_LOGIT_DIFF
        # A search's first call: the whole decoder prefix on an empty cache, then one token at a time.
        split = len(layout.decoder_prefix)
        first = ort.decode(decoder_ids[:, :split], mask, ort.empty_cache(len(ids)), cross)
        rest = ort.decode(decoder_ids[:, split:], mask, first.self_cache, cross)
        assert np.abs(np.concatenate([first.logits, rest.logits], axis=1) - reference)[keep].max() <= MAX_LOGIT_DIFF
        assert np.array_equal(first.next_ids[:, 0], reference[:, split - 1].argmax(-1))


def test_onnx_greedy_and_beam_search_from_the_prefix_equal_pytorch_generate_and_depend_on_the_target(
        exported_family):
    _, paths = exported_family
    model, tokenizer, languages = loaded(paths)
    fp32 = OnnxSeq2Seq(paths.export / "encoder.onnx", paths.export / "decoder.onnx")
    int8 = OnnxSeq2Seq(paths.export / "encoder.int8.onnx", paths.export / "decoder.int8.onnx")
    ids_of, limit = special_ids(model), 12
    greedy = {}
    for direction in DIRECTIONS:
        prefix = languages.layout(direction).decoder_prefix
        ids, mask = direction_batch(tokenizer, languages, direction, SOURCES, ids_of.pad)
        for beam in (1, 4):
            onnx = beam_search(fp32, ids, mask, beam=beam, max_new_tokens=[limit] * len(SOURCES), ids=ids_of,
                               decoder_prefix=prefix)
            assert onnx == pytorch_hypotheses(model, ids, mask, prefix, limit, beam), (direction, beam)
        greedy[direction] = onnx
        quantised = beam_search(int8, ids, mask, beam=1, max_new_tokens=[limit] * len(SOURCES), ids=ids_of,
                                decoder_prefix=prefix)
        assert all(h[-1] == ids_of.eos and ids_of.pad not in h and len(h) <= limit for h in quantised)
    # The outputs are not one token repeated whatever the input, and the target's prefix steers them.
    assert len({tuple(h) for h in greedy["en-de"]}) > 1
    assert greedy["en-de"] != greedy["en-fr"]


def test_mtpipe_translate_reads_each_family_s_export_as_its_tokenizer_and_generate_do(exported_family):
    """The runtime (no torch) on the exported directory: source ids as the checkpoint's tokenizer gives them set to
    the direction, translations as generate's from the prefix, beam 4, each sentence with its own length limit."""
    import torch

    from pipeline.prefixed_generate import generate_from_prefix
    from pipeline.runtime.translate import Translator
    from stages.tokenize.checkpoint_tokenizer import set_direction

    _, paths = exported_family
    model, tokenizer, languages = loaded(paths)
    family = check_local_checkpoint(paths.final_model)
    translator = Translator(paths.export, threads=1)
    pad = model.config.pad_token_id
    for direction in languages.directions.directions:
        lead = set_direction(tokenizer, family, direction, languages.codes)
        sources = [translator.source_ids(line, direction) for line in SOURCES]
        assert sources == tokenizer([lead + line for line in SOURCES])["input_ids"]
        prefix = translator.layout(direction).decoder_prefix
        ids, mask = pad_batch(sources, pad)
        limits = [translator.max_new_tokens(len(s), len(prefix)) for s in sources]
        with torch.no_grad():
            expected = generate_from_prefix(model, torch.from_numpy(ids), torch.from_numpy(mask), prefix, limits,
                                            eos_id=model.config.eos_token_id, pad_id=pad, num_beams=4,
                                            length_penalty=1.0, early_stopping=True, bad_words_ids=[[pad]])
        assert translator.translate_ids(sources, beam=4, length_penalty=1.0, direction=direction) == expected
        texts = translator.translate(SOURCES, beam=4, length_penalty=1.0, tgt=direction.tgt, src=direction.src)
        assert texts == [translator.tokenizer.decode(h) for h in expected]


@pytest.mark.skipif(not CTRANSLATE2_INSTALLED, reason="ctranslate2 is not installed (the `ct2` extra)")
def test_ctranslate2_decodes_each_direction_from_its_target_prefix_as_pytorch_does(exported_family):
    import ctranslate2

    from stages.export.ctranslate2_model import greedy_ids, starts_itself, target_prefix

    family, paths = exported_family
    model, tokenizer, languages = loaded(paths)
    model_dir = paths.export / "ctranslate2"
    translator = ctranslate2.Translator(str(model_dir), device="cpu")
    own_start = starts_itself(model_dir)
    ids_of, limit = special_ids(model), 12
    for direction in DIRECTIONS:
        layout = languages.layout(direction)
        prefix = target_prefix(layout, tokenizer, own_start)
        code = languages.codes[direction.split("-")[1]]
        # The target's code is what CTranslate2 is given (mBART-cc25: as its start token); Marian's tag is in
        # the source.
        assert prefix == ([] if family == "marian-multi" else [code])
        ids, mask = direction_batch(tokenizer, languages, direction, SOURCES, ids_of.pad)
        sources = [row[m.astype(bool)].tolist() for row, m in zip(ids, mask, strict=True)]
        hyps = greedy_ids(translator, tokenizer, sources, prefix, own_start, limit, ids_of.eos)
        assert hyps == pytorch_hypotheses(model, ids, mask, layout.decoder_prefix, limit, 1), direction
    for report in read_json(paths.metrics("export"))["directions"].values():
        assert report["ctranslate2"]["identical_share"] == 1.0


# --------------------------------------------------------------------------------------------------- refusals


def test_an_architecture_outside_the_families_is_refused_naming_them(tmp_path):
    from stages import export

    paths = Paths(tmp_path)
    paths.final_model.mkdir(parents=True)
    (paths.final_model / "config.json").write_text(json.dumps({"model_type": "bart"}))
    (paths.final_model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BartTokenizer"}))
    with pytest.raises(UnsupportedCheckpoint, match=r"model_type 'bart' with tokenizer 'BartTokenizer' is not a "
                                                    r"supported family\. Supported: marian .*nllb"):
        export.run(parse({}), paths)


def test_a_languages_file_of_another_family_or_without_layouts_is_refused_naming_it(tiny_checkpoint, tmp_path):
    model_dir = tmp_path / "final"
    shutil.copytree(tiny_checkpoint("mbart50"), model_dir)
    languages = write_languages(model_dir, Directions.of(["en-de"]))
    assert ModelLanguages.read(model_dir) == languages
    recorded = json.loads((model_dir / "languages.json").read_text())
    (model_dir / "languages.json").write_text(json.dumps({**recorded, "family": "nllb"}))
    with pytest.raises(PipelineError, match=r"languages\.json: family 'nllb', but the checkpoint beside it is a "
                                            r"mbart50 one"):
        ModelLanguages.read(model_dir)
    # As written before layouts were recorded.
    (model_dir / "languages.json").write_text('{"directions": ["en-de"], "target_tags": false}')
    with pytest.raises(PipelineError, match=r"languages\.json: not a languages record with every direction's layout"):
        ModelLanguages.read(model_dir)


# --------------------------------------------------------------------------------------------------- positions


def test_m2m100_positions_past_the_model_s_own_table_match_transformers():
    """transformers grows an M2M-100 position table on the fly when padding_idx + 1 + length passes its
    max_positions + 2 rows; a graph cannot, so the cached decoder builds it long enough from the start."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    from stages.export import wrappers

    torch.manual_seed(0)
    config = M2M100Config(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=12,
                          pad_token_id=6, eos_token_id=2, bos_token_id=0, decoder_start_token_id=2)
    model = M2M100ForConditionalGeneration(config).eval()
    encoder, decoder = wrappers.export_wrappers(model, beam=1)
    assert model.get_decoder().embed_positions.weights.shape[0] < 6 + 1 + 12
    ids, mask = torch.tensor([[7, 8, 9, 2]]), torch.ones(1, 4, dtype=torch.long)
    decoder_ids = torch.tensor([[2, *range(10, 21)]])  # 12 tokens: positions up to padding_idx + 12
    with torch.no_grad():
        _, *cross = encoder(ids, mask)
        logits, *_ = decoder(decoder_ids, mask, torch.arange(1), wrappers.empty_cache(model, 1), cross)
        reference = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    assert (logits - reference).abs().max() <= 1e-5


def test_a_model_type_without_a_decoder_architecture_is_refused_naming_the_ones_there_are():
    from types import SimpleNamespace

    from stages.export import wrappers

    with pytest.raises(UnsupportedCheckpoint, match=r"model_type 't5': the export writes cached decoders for "
                                                    r"marian, mbart, m2m_100 only"):
        wrappers.decoder_architecture(SimpleNamespace(model_type="t5"))
