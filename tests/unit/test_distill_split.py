"""The distill stage's pass over the training split: every source of every direction goes to the teacher once, in
chunks, and comes out as one row, with the seeded share of original pairs after them; the chunk size changes
nothing but memory."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stages.distill as distill
from pipeline.corpus import PAIR_SCHEMA, open_pair_file
from pipeline.params import DistillParams
from pipeline.runtime.languages import Directions


class MarkingTeacher:
    """Translates by tagging the source with the direction; a source "drop" comes back empty, as a teacher's
    empty output does."""

    def __init__(self):
        self.calls: list[int] = []

    def translate(self, lines, beam, *, tgt, src):
        self.calls.append(len(lines))
        return ["" if line == "drop" else f"{src}>{tgt} {line} (beam {beam})" for line in lines]


def write_train(path, rows):
    table = pa.Table.from_pylist(
        [{"src": s, "tgt": t, "src_lang": sl, "tgt_lang": tl, "origin": f"train:{n}", "line": n}
         for n, (s, t, sl, tl) in enumerate(rows, start=1)], schema=PAIR_SCHEMA)
    pq.write_table(table, path, row_group_size=4)


@pytest.fixture
def train_file(tmp_path):
    rows = []
    for n in range(23):  # the two directions interleaved, as clean writes them
        rows.append((f"en {n}", f"de {n}", "en", "de"))
        if n % 2:
            rows.append(("drop" if n == 5 else f"en' {n}", f"fr {n}", "en", "fr"))
    path = tmp_path / "train.parquet"
    write_train(path, rows)
    return path


def distill_with(train_file, out, chunk, monkeypatch, ratio=0.25):
    monkeypatch.setattr(distill, "CHUNK", chunk)
    cfg = DistillParams(enabled=True, original_ratio=ratio, seed=3, beam=2)
    out.mkdir()
    teacher = MarkingTeacher()
    figures = distill.distill_split(open_pair_file(train_file), teacher, Directions.of(["en-de", "en-fr"]),
                                    cfg, "abc123", out)
    return figures, pq.read_table(out / "train.parquet").to_pylist(), teacher


def test_every_source_is_translated_once_and_the_originals_follow(train_file, tmp_path, monkeypatch):
    figures, rows, teacher = distill_with(train_file, tmp_path / "out", 5, monkeypatch)
    assert figures["en-de"] | {"seconds": 0, "sentences_per_s": 0} == {
        "sources": 23, "translated": 23, "empty": 0, "references": 6, "seconds": 0, "sentences_per_s": 0}
    assert (figures["en-fr"]["sources"], figures["en-fr"]["empty"], figures["en-fr"]["references"]) == (11, 1, 3)
    assert max(teacher.calls) <= 5 + 4  # a chunk, plus at most one read batch's share past it
    distilled = [r for r in rows if r["origin"].startswith("teacher abc123: ")]
    originals = [r for r in rows if r["origin"].startswith("reference: ")]
    assert len(distilled) == 34 and len(originals) == 9 and rows == distilled + originals
    source = pq.read_table(train_file).to_pylist()
    by_origin = {r["origin"]: r for r in source}
    for row in distilled:
        original = by_origin[row["origin"].removeprefix("teacher abc123: ")]
        expected = "" if original["src"] == "drop" else f"en>{original['tgt_lang']} {original['src']} (beam 2)"
        assert row["tgt"] == expected and row["src"] == original["src"] and row["line"] == original["line"]
    for row in originals:
        assert {**row, "origin": row["origin"].removeprefix("reference: ")} in source
    assert sorted(r["origin"] for r in distilled) == sorted("teacher abc123: " + r["origin"] for r in source)


def test_the_chunk_size_changes_nothing_but_the_calls(train_file, tmp_path, monkeypatch):
    small = distill_with(train_file, tmp_path / "small", 2, monkeypatch)
    whole = distill_with(train_file, tmp_path / "whole", 4096, monkeypatch)
    assert sorted(small[1], key=str) == sorted(whole[1], key=str)
    assert whole[2].calls == [23, 11] and len(small[2].calls) > 10
    per_direction = [[r for r in rows if r["src_lang"] + r["tgt_lang"] == "enfr"] for rows in (small[1], whole[1])]
    assert per_direction[0] == per_direction[1]  # within a direction, the order of the split


def test_without_originals_the_corpus_is_the_teachers_alone(train_file, tmp_path, monkeypatch):
    figures, rows, _ = distill_with(train_file, tmp_path / "out", 7, monkeypatch, ratio=0.0)
    assert len(rows) == 34 and all(r["origin"].startswith("teacher ") for r in rows)
    assert not (tmp_path / "out" / "originals.parquet").exists()
