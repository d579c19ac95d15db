"""The lexical shortlist: IBM Model 1's table and the candidates it keeps (stages/export/shortlist.py), each
sentence's list as the runtime builds it (pipeline/runtime/shortlist.py), and the file between them."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.runtime.export_format import ExportDirError
from pipeline.runtime.shortlist import Shortlist
from stages.export.shortlist import build_shortlist, lexical_table

PAD = 99


def test_model_1_learns_which_target_id_each_source_id_translates_to():
    # Source ids 1..4 translate to 11..14 in every order; each sentence also has the frequent 10 (like "."),
    # which co-occurs with everything but is explained by NULL or spread thin.
    rng = np.random.default_rng(0)
    sources, targets = [], []
    for _ in range(300):
        words = rng.choice([1, 2, 3, 4], size=3, replace=False)
        sources.append(words.tolist())
        targets.append(rng.permutation([w + 10 for w in words]).tolist() + [10])
    pair_src, pair_tgt, prob = lexical_table(sources, targets, source_vocab=5)
    for word in (1, 2, 3, 4):
        mine = pair_src == word
        assert pair_tgt[mine][np.argmax(prob[mine])] == word + 10
        assert prob[mine].sum() == pytest.approx(1.0)


def test_the_shortlist_keeps_each_sources_likeliest_targets_and_the_most_frequent():
    sources = [[1, 2], [1, 3], [2, 3], [1]] * 20
    targets = [[11, 12, 9], [11, 13, 9], [12, 13, 9], [11, 9]] * 20
    shortlist = build_shortlist(sources, targets, source_vocab=5, per_source=1, frequent=1, eos_id=0)
    assert shortlist.by_source[1].tolist() == [11]
    assert shortlist.by_source[2].tolist() == [12]
    assert shortlist.by_source[3].tolist() == [13]
    assert shortlist.by_source[0].tolist() == [-1] and shortlist.by_source[4].tolist() == [-1]  # never seen
    assert shortlist.always.tolist() == [0, 9]  # </s> and the most frequent target id


def test_a_sentences_list_is_its_sources_candidates_and_the_always_ids_sorted_once_each():
    shortlist = Shortlist(by_source=np.array([[-1, -1], [11, 12], [12, 13], [-1, -1]]), always=np.array([0, 5]))
    ids = np.array([[1, 2, 0], [3, PAD, PAD]])
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    rows = shortlist.for_batch(ids, mask, pad_id=PAD, minimum=1)
    assert rows.tolist() == [[0, 5, 11, 12, 13], [0, 5, PAD, PAD, PAD]]
    # Padded source positions add nothing, even where the pad id has candidates; ids past the table add nothing.
    assert shortlist.for_batch(np.array([[7, 1]]), np.array([[1, 1]]), PAD, 1).tolist() == [[0, 5, 11, 12]]
    # At least `minimum` wide: what the graph's top-k needs.
    assert shortlist.for_batch(np.array([[3]]), np.array([[1]]), PAD, 4).tolist() == [[0, 5, PAD, PAD]]


def test_the_file_round_trips_and_a_bad_one_is_named(tmp_path):
    shortlist = Shortlist(by_source=np.array([[1, -1], [2, 3]]), always=np.array([0]))
    shortlist.write(tmp_path / "shortlist.npz")
    back = Shortlist.read(tmp_path / "shortlist.npz")
    assert back.by_source.tolist() == [[1, -1], [2, 3]] and back.always.tolist() == [0]
    np.savez(tmp_path / "bad.npz", by_source=np.zeros(3))
    with pytest.raises(ExportDirError, match="bad.npz"):
        Shortlist.read(tmp_path / "bad.npz")
    with pytest.raises(ExportDirError, match="missing.npz not found"):
        Shortlist.read(tmp_path / "missing.npz")


def test_a_training_split_without_pairs_or_missing_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.artifacts import Paths
    from pipeline.corpus import PAIR_SCHEMA
    from pipeline.errors import MissingArtifact
    from pipeline.runtime.errors import PipelineError
    from stages.export.shortlist import training_pairs

    paths = Paths(tmp_path)
    with pytest.raises(MissingArtifact, match="train"):
        training_pairs(paths, tokenizer=None)
    paths.clean.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([], schema=PAIR_SCHEMA), paths.split_file(paths.clean, "train"))
    with pytest.raises(PipelineError, match=r"train\.parquet: no training pairs"):
        training_pairs(paths, tokenizer=lambda texts=None, text_target=None, **_: {"input_ids": []})
