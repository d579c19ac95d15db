"""What the settings around tokenize change, on one direction: separate vocabularies (`tokenize.joint: false`), a
pretrained checkpoint's own tokenizer (`model.init: pretrained`), and pairs over `train.max_len`, counted or dropped
(several directions are test_tokenize_several_directions.py's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from pipeline.runtime.languages import Directions
from pipeline.runtime.model_languages import ModelLanguages
from pipeline.token_arrays import TokenArray
from stages import tokenize
from tests.conftest import write_clean_splits


def ids_of(tokenized: Path, split: str, side: str) -> list[list[int]]:
    arrays = TokenArray.open(tokenized / f"{split}.{side}")
    return [arrays[i].tolist() for i in range(len(arrays))]


def hf_ids(tokenizer_dir: Path, root: Path, split: str) -> tuple[list[list[int]], list[list[int]]]:
    from transformers import AutoTokenizer

    from pipeline.corpus import read_pairs

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    src, tgt = read_pairs(root / "data" / "clean" / f"{split}.parquet")
    return tok(src).input_ids, tok(text_target=tgt).input_ids


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    write_clean_splits(root, {"train": 3000, "valid": 100, "test": 200})
    return root


def fresh_root(corpus: Path, tmp_path: Path) -> Paths:
    shutil.copytree(corpus / "data", tmp_path / "data")
    return Paths(tmp_path)


def test_separate_vocabularies_give_one_model_per_side_with_the_same_pad_id(corpus, tmp_path):
    paths = fresh_root(corpus, tmp_path)
    tokenize.run(parse({"tokenize": {"vocab_size": 800, "joint": False, "threads": 1}}), paths)
    hf = paths.tokenized / "hf_tokenizer"
    src_vocab = json.loads((hf / "vocab.json").read_text())
    tgt_vocab = json.loads((hf / "target_vocab.json").read_text())
    assert len(src_vocab) == len(tgt_vocab) == 801
    assert src_vocab["<pad>"] == tgt_vocab["<pad>"] == 800
    assert src_vocab != tgt_vocab  # English and German pieces differ
    meta = json.loads((paths.tokenized / "meta.json").read_text())
    assert meta["joint"] is False and meta["pad_id"] == 800
    assert ModelLanguages.read(hf).directions == Directions.of(["en-de"])
    src_ids, tgt_ids = hf_ids(hf, tmp_path, "test")
    assert src_ids == ids_of(paths.tokenized, "test", "src")
    assert tgt_ids == ids_of(paths.tokenized, "test", "tgt")


def test_the_runtime_tokenizer_reads_separate_vocabularies_as_marian_tokenizer_does(corpus, tmp_path):
    """`mtpipe translate` decodes target ids with the target side's pieces (target_vocab.json), not vocab.json's
    source pieces at the same ids, and cuts sources as MarianTokenizer does."""
    from transformers import AutoTokenizer

    from pipeline.corpus import read_pairs
    from pipeline.runtime.text_pieces import TokenizerFilesError, text_pieces

    paths = fresh_root(corpus, tmp_path)
    tokenize.run(parse({"tokenize": {"vocab_size": 800, "joint": False, "threads": 1}}), paths)
    hf = paths.tokenized / "hf_tokenizer"
    tokenizer, runtime = AutoTokenizer.from_pretrained(hf), text_pieces(hf, "marian")
    src, tgt = read_pairs(tmp_path / "data" / "clean" / "test.parquet")
    target_ids = ids_of(paths.tokenized, "test", "tgt")
    decoded = [runtime.decode(ids) for ids in target_ids]
    assert decoded == tokenizer.batch_decode(target_ids, skip_special_tokens=True)
    assert sum(d == t for d, t in zip(decoded, tgt, strict=True)) >= 0.9 * len(tgt)  # the German text itself
    assert [runtime.pieces(s) for s in src] == tokenizer(src, add_special_tokens=False).input_ids

    (hf / "target_vocab.json").unlink()
    with pytest.raises(TokenizerFilesError, match="target_vocab.json not found"):
        text_pieces(hf, "marian")


def test_separate_vocabulary_too_large_for_the_corpus_names_the_param(corpus, tmp_path):
    from pipeline.runtime.errors import PipelineError

    paths = fresh_root(corpus, tmp_path)
    with pytest.raises(PipelineError, match="tokenize.vocab_size=60000"):
        tokenize.run(parse({"tokenize": {"vocab_size": 60000, "joint": False}}), paths)


def test_pretrained_init_encodes_with_the_checkpoint_tokenizer(corpus, tmp_path, tiny_model_dir):
    paths = fresh_root(corpus, tmp_path)
    params = parse({"model": {"init": "pretrained", "name_or_path": str(tiny_model_dir)}})
    tokenize.run(params, paths)
    assert not (paths.tokenized / "spm.model").exists()  # nothing trained
    meta = json.loads((paths.tokenized / "meta.json").read_text())
    assert meta["tokenizer"] == str(tiny_model_dir)
    languages = ModelLanguages.read(paths.tokenized / "hf_tokenizer")
    assert languages.directions == Directions.of(["en-de"]) and languages.target_tags is False
    src_ids, tgt_ids = hf_ids(tiny_model_dir, tmp_path, "test")
    assert src_ids == ids_of(paths.tokenized, "test", "src")
    assert tgt_ids == ids_of(paths.tokenized, "test", "tgt")


def test_pairs_over_max_len_are_counted_or_dropped_never_silently(corpus, tmp_path):
    paths = fresh_root(corpus, tmp_path)
    tokenize.run(parse({"tokenize": {"vocab_size": 1000}, "train": {"max_len": 12}}), paths)
    counted = json.loads(paths.metrics("tokenize").read_text())["splits"]["train"]
    assert counted["pairs"] == 3000 and counted["over_max_len_truncated"] > 100

    tokenize.run(parse({"tokenize": {"vocab_size": 1000, "overlong": "drop"}, "train": {"max_len": 12}}), paths)
    dropped = json.loads(paths.metrics("tokenize").read_text())["splits"]
    assert dropped["train"]["over_max_len_dropped"] == counted["over_max_len_truncated"]
    assert dropped["train"]["pairs"] == 3000 - dropped["train"]["over_max_len_dropped"]
    assert max(len(s) for s in ids_of(paths.tokenized, "train", "tgt")) <= 12
    assert dropped["test"]["pairs"] == 200  # test sets are never dropped from
