"""tokenize.sampled_copies: the training pairs written again after their one-best rows, each copy in segmentations
drawn from the unigram model's n-best (Kudo's subword regularization), the same arrays in every process; the
other splits, and the one-best rows, exactly as without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifacts import Paths
from pipeline.params import ParamsError, parse
from pipeline.token_arrays import TokenArray, read_row_directions
from stages import tokenize
from stages.tokenize.subword_sampling import draw
from tests.conftest import write_clean_splits

TWO = ("en-de", "en-fr")
SIZES = {"train": 600, "valid": 40, "test": 40}
COPIES = 2


def params(copies: int) -> dict:
    files = {split: {"pattern": f"corpus/{split}.{{lang}}"} for split in SIZES}
    return {"data": {"source": "files", "directions": list(TWO), "files": files},
            "tokenize": {"vocab_size": 1000, "threads": 1, "seed": 7, "sampled_copies": copies}}


def tokenized_with(root: Path, copies: int) -> Paths:
    write_clean_splits(root, SIZES, TWO)
    paths = Paths(root)
    tokenize.run(parse(params(copies)), paths)
    return paths


@pytest.fixture(scope="module")
def one_best(tmp_path_factory) -> Paths:
    return tokenized_with(tmp_path_factory.mktemp("one_best"), 0)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory) -> Paths:
    return tokenized_with(tmp_path_factory.mktemp("sampled"), COPIES)


def rows(paths: Paths, split: str, side: str) -> list[list[int]]:
    array = TokenArray.open(paths.tokenized / f"{split}.{side}")
    return [array[i].tolist() for i in range(len(array))]


def file_bytes(paths: Paths, split: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(paths.tokenized.glob(f"{split}.*"))}


def test_the_copies_follow_the_one_best_rows_and_the_other_splits_are_untouched(one_best, sampled):
    n = 2 * SIZES["train"]
    for side in ("src", "tgt"):
        one, all_rows = rows(one_best, "train", side), rows(sampled, "train", side)
        assert len(one) == n and len(all_rows) == (1 + COPIES) * n
        assert all_rows[:n] == one  # row i of the first pass is the split's row i
    directions = read_row_directions(sampled.tokenized / "train")
    assert directions.tolist() == read_row_directions(one_best.tokenized / "train").tolist() * (1 + COPIES)
    for split in ("valid", "test"):
        assert file_bytes(sampled, split) == file_bytes(one_best, split)
    metrics = json.loads(sampled.metrics("tokenize").read_text())["splits"]
    assert metrics["train"]["pairs"] == (1 + COPIES) * n and metrics["train"]["segmentations_per_pair"] == 1 + COPIES
    assert "segmentations_per_pair" not in metrics["valid"]


def test_each_copy_is_another_segmentation_of_the_same_text_with_its_tag_and_eos(sampled):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(sampled.spm_model))
    n = 2 * SIZES["train"]
    meta = json.loads((sampled.tokenized / "meta.json").read_text())
    for side in ("src", "tgt"):
        all_rows = rows(sampled, "train", side)
        one = all_rows[:n]
        for copy in range(1, COPIES + 1):
            copy_rows = all_rows[copy * n:(copy + 1) * n]
            # Tags (sources only) and </s> where the one best has them, and the same text between them.
            assert [r[-1] for r in copy_rows] == [meta["eos_id"]] * n
            if side == "src":
                assert [r[0] for r in copy_rows] == [r[0] for r in one]
            body = slice(1 if side == "src" else 0, -1)
            assert [sp.decode(r[body]) for r in copy_rows] == [sp.decode(r[body]) for r in one]
            changed = sum(c != o for c, o in zip(copy_rows, one, strict=True))
            assert 0.2 * n < changed < n, f"{side} copy {copy}: {changed} of {n} rows segmented differently"
        assert all_rows[n:2 * n] != all_rows[2 * n:], "the copies draw independently"


def test_a_fresh_process_writes_the_same_sampled_arrays(sampled, tmp_path):
    """SentencePiece's own sampler gives other segmentations in another process; this one may not."""
    code = ("import sys; from pathlib import Path; from pipeline.artifacts import Paths; "
            "from pipeline.params import parse; from stages import tokenize; "
            "from tests.unit.test_tokenize_subword_sampling import params, write_clean_splits, SIZES, TWO; "
            "root = Path(sys.argv[1]); write_clean_splits(root, SIZES, TWO); "
            f"tokenize.run(parse(params({COPIES})), Paths(root))")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=Path(__file__).parents[2])
    assert file_bytes(Paths(tmp_path), "train") == file_bytes(sampled, "train")


def test_the_draw_follows_p_proportional_to_the_probability_to_the_alpha():
    log_probs = np.array([0.0, *np.log([0.5, 0.3, 0.2])])  # id 0: a control piece (score 0), in no candidate
    candidates = [[1], [2], [3, 3]]  # log P: log 0.5, log 0.3, 2 log 0.2
    rng = np.random.default_rng(0)
    for alpha in (1.0, 0.1):
        weights = np.array([0.5, 0.3, 0.04]) ** alpha
        picks = [draw(candidates, log_probs, alpha, rng) for _ in range(20000)]
        shares = np.array([picks.count(c) for c in candidates]) / len(picks)
        assert np.allclose(shares, weights / weights.sum(), atol=0.015), (alpha, shares)


def test_sampling_needs_a_trained_unigram_model():
    with pytest.raises(ParamsError, match="tokenize.model_type: unigram"):
        parse({"tokenize": {"model_type": "bpe", "sampled_copies": 1}})
    with pytest.raises(ParamsError, match="sampled_copies: 0"):
        parse({"model": {"init": "pretrained", "name_or_path": "some/model"}, "tokenize": {"sampled_copies": 1}})
