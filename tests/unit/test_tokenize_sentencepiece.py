"""tokenize stage: a joint SentencePiece model in the Marian vocabulary layout, every split encoded to arrays,
and a transformers tokenizer that gives exactly the stored ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.artifacts import Paths
from pipeline.corpus import PAIR_SCHEMA, read_pairs
from pipeline.errors import MissingArtifact
from pipeline.params import parse
from pipeline.runtime.languages import Directions
from pipeline.runtime.model_languages import ModelLanguages
from pipeline.token_arrays import TokenArray, read_row_directions
from stages import tokenize
from stages.clean.normalization import normalize
from tests.conftest import write_clean_splits

SIZES = {"train": 3000, "valid": 100, "test": 1000}
PARAMS = {"tokenize": {"vocab_size": 1000, "threads": 1, "seed": 7}}


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> Paths:
    """Multi30k en-de (3000 training pairs) tokenized once for the whole module."""
    paths = Paths(tmp_path_factory.mktemp("tokenized"))
    write_clean_splits(paths.root, SIZES)
    tokenize.run(parse(PARAMS), paths)
    return paths


def meta_of(paths: Paths) -> dict:
    return json.loads((paths.tokenized / "meta.json").read_text(encoding="utf-8"))


def arrays(paths: Paths, split: str) -> dict[str, TokenArray]:
    return {side: TokenArray.open(paths.tokenized / f"{split}.{side}") for side in ("src", "tgt")}


def test_vocabulary_has_eos_0_unk_1_and_pad_as_the_last_id(tokenized):
    meta = meta_of(tokenized)
    vocab = json.loads((tokenized.tokenized / "hf_tokenizer" / "vocab.json").read_text(encoding="utf-8"))

    assert (meta["eos_id"], meta["unk_id"]) == (0, 1)
    assert vocab["</s>"] == 0 and vocab["<unk>"] == 1
    assert vocab["<pad>"] == meta["pad_id"] == meta["vocab_size"] - 1 == max(vocab.values())
    assert sorted(vocab.values()) == list(range(meta["vocab_size"]))  # dense ids, no gaps or clashes
    assert 900 <= meta["vocab_size"] <= 1001


def test_the_vocabulary_matches_the_sentencepiece_model_piece_by_piece(tokenized):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenized.spm_model))
    vocab = json.loads((tokenized.tokenized / "hf_tokenizer" / "vocab.json").read_text(encoding="utf-8"))
    pieces = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    assert pieces == {k: v for k, v in vocab.items() if k != "<pad>"}
    assert sp.get_piece_size() == meta_of(tokenized)["pad_id"]


def test_every_split_is_encoded_as_uint16_tokens_with_offsets(tokenized):
    meta = meta_of(tokenized)
    assert meta["dtype"] == "uint16"
    assert meta["splits"] == ["train", "valid", "test"]
    for split, n in SIZES.items():
        for side, arr in arrays(tokenized, split).items():
            offsets = np.load(tokenized.tokenized / f"{split}.{side}.idx.npy")
            tokens = np.fromfile(tokenized.tokenized / f"{split}.{side}.bin", dtype=np.uint16)
            assert offsets.dtype == np.int64 and len(offsets) == n + 1
            assert offsets[0] == 0 and offsets[-1] == len(tokens) and np.all(np.diff(offsets) >= 2)
            assert arr.tokens.dtype == np.uint16 and len(arr) == n
            assert tokens.max() < meta["pad_id"]  # padding is the collator's business, never stored
            ends = tokens[offsets[1:] - 1]
            assert np.all(ends == meta["eos_id"]), f"{split}.{side}: every sentence ends with </s>"


def test_transformers_tokenizer_gives_identical_ids_on_the_whole_test_split(tokenized):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenized.tokenized / "hf_tokenizer")
    src, tgt = read_pairs(tokenized.split_file(tokenized.clean, "test"))
    stored = arrays(tokenized, "test")

    src_ids = tok(src)["input_ids"]
    tgt_ids = tok(text_target=tgt)["input_ids"]

    assert len(src_ids) == len(tgt_ids) == len(stored["src"]) == SIZES["test"]
    src_diff = [i for i, ids in enumerate(src_ids) if ids != stored["src"][i].tolist()]
    tgt_diff = [i for i, ids in enumerate(tgt_ids) if ids != stored["tgt"][i].tolist()]
    assert src_diff == [] and tgt_diff == []
    assert tok.pad_token_id == meta_of(tokenized)["pad_id"] and tok.eos_token_id == 0


def cleaned(texts: list[str]) -> list[str]:
    """The text as the clean stage leaves it (the fixture's splits are raw Multi30k lines, e.g. with NBSPs)."""
    return normalize(pa.array(texts), "NFC").to_pylist()


def test_decoding_the_arrays_gives_back_the_cleaned_text(tokenized):
    import sentencepiece as spm
    from transformers import AutoTokenizer

    sp = spm.SentencePieceProcessor(model_file=str(tokenized.spm_model))
    tok = AutoTokenizer.from_pretrained(tokenized.tokenized / "hf_tokenizer")
    for split in ("valid", "test"):
        src, tgt = read_pairs(tokenized.split_file(tokenized.clean, split))
        texts = {"src": cleaned(src), "tgt": cleaned(tgt)}
        for side, arr in arrays(tokenized, split).items():
            sequences = [arr[i][:-1].tolist() for i in range(len(arr))]  # drop the final </s>
            assert sp.decode(sequences) == texts[side], f"{split}.{side}"
        first = [arrays(tokenized, split)["tgt"][i].tolist() for i in range(50)]
        assert tok.batch_decode(first, skip_special_tokens=True) == texts["tgt"][:50]


def test_metrics_report_token_length_statistics_and_unk_rate_per_split(tokenized):
    metrics = json.loads(tokenized.metrics("tokenize").read_text(encoding="utf-8"))
    meta = meta_of(tokenized)
    assert metrics["vocab_size"] == meta["vocab_size"] and metrics["dtype"] == "uint16"
    assert set(metrics["splits"]) == set(SIZES)
    for split, n in SIZES.items():
        stats = metrics["splits"][split]
        assert stats["pairs"] == n
        unknown = total = 0
        for side, arr in arrays(tokenized, split).items():
            lengths = arr.lengths
            assert stats[f"{side}_tokens"]["mean"] == pytest.approx(lengths.mean(), abs=0.01)
            assert stats[f"{side}_tokens"]["p50"] == pytest.approx(np.percentile(lengths, 50))
            assert stats[f"{side}_tokens"]["p99"] == pytest.approx(np.percentile(lengths, 99))
            assert stats[f"{side}_tokens"]["max"] == lengths.max()
            unknown += int(np.count_nonzero(np.asarray(arr.tokens) == meta["unk_id"]))
            total += len(arr.tokens)
        assert stats["unk_rate"] == pytest.approx(unknown / total, abs=1e-6)


def test_characters_never_seen_in_training_count_towards_the_unk_rate_without_byte_fallback(tmp_path):
    paths = Paths(tmp_path)
    write_clean_splits(tmp_path, {"train": 1000, "valid": 20, "test": 20})
    unseen = ["☃ ☃ ☃", "❄ ☃"]  # five characters that Multi30k never uses
    pq.write_table(
        pa.table({"src": unseen, "tgt": unseen, "src_lang": ["en"] * 2, "tgt_lang": ["de"] * 2, "origin": ["x"] * 2,
                  "line": [1, 2]}, schema=PAIR_SCHEMA),
        paths.clean / "symbols.parquet",
    )

    tokenize.run(parse({"tokenize": {"vocab_size": 500, "byte_fallback": False, "threads": 1}}), paths)

    stats = json.loads(paths.metrics("tokenize").read_text(encoding="utf-8"))["splits"]["symbols"]
    src = arrays(paths, "symbols")["src"]
    unknown = int(np.count_nonzero(np.asarray(src.tokens) == 1))
    assert unknown >= 5
    assert stats["unk_rate"] == pytest.approx(unknown / len(src.tokens), abs=1e-6)
    assert stats["unk_rate"] > 0.3


def test_one_direction_has_no_target_tags_and_records_its_direction(tokenized):
    from transformers import AutoTokenizer

    meta = meta_of(tokenized)
    hf = tokenized.tokenized / "hf_tokenizer"
    vocab = json.loads((hf / "vocab.json").read_text(encoding="utf-8"))
    languages = ModelLanguages.read(hf)
    assert languages.directions == Directions.of(["en-de"]) and languages.target_tags is False
    assert languages.codes == {} and not {"directions", "target_tags", "target_tag_ids"} & set(meta)
    assert not [piece for piece in vocab if piece.startswith(">>")]
    assert AutoTokenizer.from_pretrained(hf).source_lang == "en"
    for split, n in SIZES.items():
        rows = read_row_directions(tokenized.tokenized / split)
        assert rows.dtype == np.uint8 and rows.tolist() == [0] * n
    metrics = json.loads(tokenized.metrics("tokenize").read_text(encoding="utf-8"))
    assert metrics["splits"]["valid"]["pairs_per_direction"] == {"en-de": SIZES["valid"]}
    assert "sentencepiece_sample" not in metrics  # SentencePiece samples the stream itself, as before directions


def test_same_inputs_and_seed_give_a_byte_identical_sentencepiece_model(tokenized, tmp_path):
    again = Paths(tmp_path)
    write_clean_splits(tmp_path, SIZES)
    tokenize.run(parse(PARAMS), again)

    assert again.spm_model.read_bytes() == tokenized.spm_model.read_bytes()
    for name in ("test.src.bin", "test.tgt.bin", "test.dir.npy", "meta.json", "hf_tokenizer/vocab.json"):
        assert (again.tokenized / name).read_bytes() == (tokenized.tokenized / name).read_bytes(), name


def test_missing_clean_data_names_the_clean_stage(tmp_path: Path):
    with pytest.raises(MissingArtifact) as err:
        tokenize.run(parse(PARAMS), Paths(tmp_path))
    assert "'clean'" in str(err.value)
    assert str(Paths(tmp_path).clean / "train.parquet") in str(err.value)
    assert not Paths(tmp_path).tokenized.exists()
