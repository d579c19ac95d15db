"""tokenize with several directions: one joint SentencePiece model whose target tags are single reserved pieces,
every source row led by its target's tag, each row's direction stored beside the arrays, and the transformers
tokenizer (and mtpipe translate's) giving exactly the stored ids for ">>de<< text"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.artifacts import Paths
from pipeline.params import ParamsError, parse
from pipeline.runtime.errors import InputFileError, PipelineError
from pipeline.runtime.languages import Directions, temperature_shares
from pipeline.runtime.model_languages import ModelLanguages
from pipeline.token_arrays import TokenArray, read_row_directions
from stages import tokenize
from tests.conftest import write_clean_splits

THREE = ("en-de", "en-fr", "en-cs")
SIZES = {"train": 2000, "valid": 100, "test": 150}
TAGS = [">>de<<", ">>fr<<", ">>cs<<"]


def multi_params(directions: tuple[str, ...] = THREE, tokenize_params: dict | None = None, **sections) -> dict:
    """Params of a multi-direction `files` corpus (tokenize reads data/clean only; the patterns are never opened)."""
    files = {split: {"pattern": f"corpus/{split}.{{lang}}"} for split in SIZES}
    return {"data": {"source": "files", "directions": list(directions), "files": files},
            "tokenize": {"vocab_size": 1000, "threads": 1, "seed": 7, **(tokenize_params or {})}, **sections}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("three_directions")
    write_clean_splits(root, SIZES, THREE)
    return root


@pytest.fixture(scope="module")
def tokenized(corpus) -> Paths:
    """The three directions' Multi30k splits (2000 training pairs each) tokenized once for the module."""
    paths = Paths(corpus)
    tokenize.run(parse(multi_params()), paths)
    return paths


def meta_of(paths: Paths) -> dict:
    return json.loads((paths.tokenized / "meta.json").read_text(encoding="utf-8"))


def tag_ids(paths: Paths) -> dict[str, int]:
    """Each target tag's id, as languages.json's layouts put it in front of the sources ({} without tags)."""
    languages = ModelLanguages.read(paths.tokenized / "hf_tokenizer")
    return {languages.codes[d.tgt]: languages.layout(d).source_prefix[0] for d in languages.directions.directions
            if languages.layout(d).source_prefix}


def rows_of(paths: Paths, split: str) -> list[dict]:
    return pq.read_table(paths.split_file(paths.clean, split)).to_pylist()


def ids_of(paths: Paths, split: str, side: str) -> list[list[int]]:
    arrays = TokenArray.open(paths.tokenized / f"{split}.{side}")
    return [arrays[i].tolist() for i in range(len(arrays))]


def test_target_tags_are_single_reserved_pieces_right_after_the_control_pieces(tokenized):
    import sentencepiece as spm

    vocab = json.loads((tokenized.tokenized / "hf_tokenizer" / "vocab.json").read_text(encoding="utf-8"))
    sp = spm.SentencePieceProcessor(model_file=str(tokenized.spm_model))
    meta = meta_of(tokenized)

    assert [vocab[tag] for tag in TAGS] == [2, 3, 4]
    languages = ModelLanguages.read(tokenized.tokenized / "hf_tokenizer")
    assert tag_ids(tokenized) == {">>de<<": 2, ">>fr<<": 3, ">>cs<<": 4}
    assert languages.directions.names == list(THREE) and languages.target_tags is True
    assert not {"src_lang", "tgt_lang", "directions", "family"} & set(meta)  # the languages are languages.json's
    for tag in TAGS:
        assert tag in sp.encode(f"A dog{tag}runs.", out_type=str)  # one piece wherever it stands, never split
    # CTranslate2's layout is kept: </s> 0, <unk> 1, dense ids, <pad> the last one.
    assert vocab["</s>"] == 0 and vocab["<unk>"] == 1
    assert vocab["<pad>"] == meta["pad_id"] == meta["vocab_size"] - 1 == max(vocab.values())
    assert sorted(vocab.values()) == list(range(meta["vocab_size"]))
    assert 900 <= meta["vocab_size"] <= 1001


def test_every_source_row_starts_with_its_target_tag_then_the_text_pieces(tokenized):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenized.spm_model))
    tag_id = tag_ids(tokenized)
    for split in SIZES:
        rows = rows_of(tokenized, split)
        src, tgt = ids_of(tokenized, split, "src"), ids_of(tokenized, split, "tgt")
        assert len(src) == len(tgt) == len(rows) == 3 * SIZES[split]
        assert [ids[0] for ids in src] == [tag_id[f">>{r['tgt_lang']}<<"] for r in rows], split
        assert src[:50] == [[ids[0], *sp.encode(r["src"]), 0] for ids, r in zip(src[:50], rows, strict=False)]
        tags = set(tag_id.values())
        assert not any(tags & set(ids[1:]) for ids in src), f"{split}: a tag inside a source"
        assert not any(tags & set(ids) for ids in tgt), f"{split}: a tag in a target"


def test_row_directions_are_stored_per_split_and_counted_in_the_metrics(tokenized):
    metrics = json.loads(tokenized.metrics("tokenize").read_text(encoding="utf-8"))["splits"]
    for split, n in SIZES.items():
        stored = read_row_directions(tokenized.tokenized / split)
        expected = [THREE.index(f"{r['src_lang']}-{r['tgt_lang']}") for r in rows_of(tokenized, split)]
        assert stored.dtype == np.uint8 and stored.tolist() == expected
        assert metrics[split]["pairs_per_direction"] == dict.fromkeys(THREE, n)
        assert metrics[split]["pairs"] == 3 * n


def test_transformers_tokenizer_gives_identical_ids_on_every_valid_row(tokenized):
    from transformers import AutoTokenizer

    hf = tokenized.tokenized / "hf_tokenizer"
    tok, directions = AutoTokenizer.from_pretrained(hf), ModelLanguages.read(hf).directions
    rows = rows_of(tokenized, "valid")
    sources = [directions.tagged(r["src"], r["tgt_lang"]) for r in rows]

    assert sources[0].startswith(">>de<< ")
    assert tok(sources).input_ids == ids_of(tokenized, "valid", "src")
    assert tok(text_target=[r["tgt"] for r in rows]).input_ids == ids_of(tokenized, "valid", "tgt")
    assert set(TAGS) <= set(tok.supported_language_codes)


def test_mtpipe_translate_s_tokenizer_gives_identical_ids_on_every_valid_row(tokenized):
    from pipeline.runtime.translate import MarianSentencePiece

    hf = tokenized.tokenized / "hf_tokenizer"
    tok, directions = MarianSentencePiece(hf), ModelLanguages.read(hf).directions
    sources = [directions.tagged(r["src"], r["tgt_lang"]) for r in rows_of(tokenized, "valid")]
    assert [tok.encode(s) for s in sources] == ids_of(tokenized, "valid", "src")


def test_languages_json_records_the_directions_beside_the_tokenizer(tokenized):
    recorded = json.loads((tokenized.tokenized / "hf_tokenizer" / "languages.json").read_text(encoding="utf-8"))
    pad_id = json.loads((tokenized.tokenized / "meta.json").read_text(encoding="utf-8"))["pad_id"]
    assert {k: recorded[k] for k in ("directions", "family", "codes")} == {
        "directions": list(THREE), "family": "marian", "codes": {"de": ">>de<<", "fr": ">>fr<<", "cs": ">>cs<<"}}
    # Each source starts with its target's tag (ids 2, 3, 4: right after </s> and <unk>); decoding starts from <pad>.
    tag_of = {name: recorded["layouts"][name]["source_prefix"] for name in THREE}
    assert sorted(tag_of.values()) == [[2], [3], [4]]
    assert recorded["layouts"]["en-fr"] == {"source_prefix": tag_of["en-fr"], "source_suffix": [0],
                                            "target_prefix": [], "target_suffix": [0], "decoder_start": pad_id}


def test_sentencepiece_trains_on_a_sample_balanced_across_languages(tokenized):
    sample = json.loads(tokenized.metrics("tokenize").read_text(encoding="utf-8"))["sentencepiece_sample"]
    # English is the source of all three directions but each of its sentences counts once.
    sizes = {lang: sample[lang]["sentences"] for lang in ("en", "de", "fr", "cs")}
    assert 1990 <= min(sizes.values()) and max(sizes.values()) <= 2000
    shares = temperature_shares(sizes, 5.0)
    assert {lang: s["share"] for lang, s in sample.items()} == {k: round(v, 4) for k, v in shares.items()}
    assert sum(s["drawn"] for s in sample.values()) == sum(sizes.values())


def test_dropped_overlong_pairs_leave_the_row_directions_aligned(corpus, tmp_path):
    shutil.copytree(corpus / "data" / "clean", tmp_path / "data" / "clean")
    paths = Paths(tmp_path)
    tokenize.run(parse(multi_params(tokenize_params={"overlong": "drop"}, train={"max_len": 30})), paths)

    metrics = json.loads(paths.metrics("tokenize").read_text(encoding="utf-8"))["splits"]["train"]
    stored = read_row_directions(paths.tokenized / "train")
    src = ids_of(paths, "train", "src")
    assert 0.1 < metrics["over_max_len_dropped"] / (3 * SIZES["train"]) < 0.9
    assert len(stored) == len(src) == metrics["pairs"] == 3 * SIZES["train"] - metrics["over_max_len_dropped"]
    tag_id = [tag_ids(paths)[tag] for tag in TAGS]
    assert [ids[0] for ids in src] == [tag_id[d] for d in stored.tolist()]  # each kept row's tag is its direction's
    counts = np.bincount(stored, minlength=3).tolist()
    assert metrics["pairs_per_direction"] == {d: n for d, n in zip(THREE, counts, strict=True) if n}


def test_several_sources_into_one_target_need_no_tags(tmp_path):
    write_clean_splits(tmp_path, {"train": 800, "valid": 20, "test": 20}, ("de-en", "fr-en"))
    paths = Paths(tmp_path)
    tokenize.run(parse(multi_params(("de-en", "fr-en"), {"vocab_size": 500})), paths)

    vocab = json.loads((paths.tokenized / "hf_tokenizer" / "vocab.json").read_text(encoding="utf-8"))
    assert ModelLanguages.read(paths.tokenized / "hf_tokenizer").target_tags is False and tag_ids(paths) == {}
    assert not [piece for piece in vocab if piece.startswith(">>")]
    assert read_row_directions(paths.tokenized / "valid").tolist() == [0] * 20 + [1] * 20
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths.tokenized / "hf_tokenizer")
    assert tok([r["src"] for r in rows_of(paths, "valid")]).input_ids == ids_of(paths, "valid", "src")


def test_separate_models_per_side_with_several_directions_are_refused_naming_the_params():
    # Refused by the params schema, so `dvc repro` stops in check_params before any stage runs.
    with pytest.raises(ParamsError, match=r"tokenize.joint: false .* use tokenize.joint: true"):
        parse(multi_params(tokenize_params={"joint": False}))


def test_rows_of_a_direction_the_params_do_not_name_are_refused_before_training(corpus, tmp_path):
    shutil.copytree(corpus / "data" / "clean", tmp_path / "data" / "clean")
    with pytest.raises(InputFileError, match=r"train.parquet: row 4000 is a 'en-cs' pair, not one of data.directions"):
        tokenize.run(parse(multi_params(("en-de", "en-fr"))), Paths(tmp_path))
    assert not Paths(tmp_path).tokenized.exists()


# ---------------------------------------------------------------------------------- pretrained and CTranslate2


@pytest.fixture(scope="module")
def tagged_model(tokenized, tmp_path_factory) -> Path:
    """An untrained tiny Marian model over the three-direction tokenizer, saved as models/final would be."""
    from stages.train.model import build_model
    from stages.train.save import save_final

    meta = meta_of(tokenized)
    model = build_model(parse({"model": {"preset": "tiny"}}).model, meta["vocab_size"], meta["pad_id"],
                        meta["eos_id"])
    out = tmp_path_factory.mktemp("tagged_model") / "final"
    save_final(model, tokenized.tokenized / "hf_tokenizer", out)
    return out


def test_a_pretrained_marian_checkpoint_with_the_tags_encodes_exactly_as_the_trained_tokenizer(
    tokenized, tagged_model, tmp_path
):
    shutil.copytree(tokenized.clean, tmp_path / "data" / "clean")
    paths = Paths(tmp_path)
    tokenize.run(parse(multi_params(model={"init": "pretrained", "name_or_path": str(tagged_model)})), paths)

    assert not paths.spm_model.exists()
    assert tag_ids(paths) == tag_ids(tokenized)
    assert ModelLanguages.read(paths.tokenized / "hf_tokenizer").directions == Directions.of(THREE)
    for side in ("src", "tgt"):
        assert ids_of(paths, "valid", side) == ids_of(tokenized, "valid", side)
    stored = [read_row_directions(p.tokenized / "test") for p in (paths, tokenized)]
    assert np.array_equal(*stored)


def test_a_pretrained_checkpoint_without_the_tags_is_refused_naming_the_missing_ones(
    tokenized, tiny_model_dir, tmp_path
):
    shutil.copytree(tokenized.clean, tmp_path / "data" / "clean")
    params = parse(multi_params(model={"init": "pretrained", "name_or_path": str(tiny_model_dir)}))
    with pytest.raises(PipelineError, match=r"MarianTokenizer without >>de<<, >>fr<<, >>cs<<"):
        tokenize.run(params, Paths(tmp_path))


def test_ctranslate2_converts_a_model_over_the_tagged_vocabulary(tagged_model, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    TransformersConverter(str(tagged_model)).convert(str(tmp_path / "ct2"))
    vocab = json.loads((tagged_model / "vocab.json").read_text(encoding="utf-8"))
    converted = json.loads((tmp_path / "ct2" / "shared_vocabulary.json").read_text(encoding="utf-8"))
    assert converted[: len(vocab) - 1] == sorted(vocab, key=vocab.get)[:-1]  # every piece, tags included, in place
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    result = translator.translate_batch([[">>fr<<", "▁A", "</s>"]], beam_size=1, max_decoding_length=3)
    assert len(result[0].hypotheses[0]) <= 3
