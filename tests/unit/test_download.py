"""download stage: aligned text files (plain or .gz), the embedded sample and WMT14 into `data/raw/<split>.parquet`."""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import artifacts
from pipeline.artifacts import Paths
from pipeline.errors import CorpusMisaligned, HubUnreachable, InputFileError
from pipeline.params import parse
from stages import download
from tests.conftest import MULTI30K

TRAIN = [
    ("A dog runs in the park.", "Ein Hund rennt im Park."),
    ("Two children play football.", "Zwei Kinder spielen Fußball."),
    ("The woman reads a book.", "Die Frau liest ein Buch."),
    ("A man rides a red bicycle.", "Ein Mann fährt ein rotes Fahrrad."),
    ("The sun is shining.", "Die Sonne scheint."),
    ("A cat sleeps on the sofa.", "Eine Katze schläft auf dem Sofa."),
]
VALID = [("It rains.", "Es regnet."), ("The bus is late.", "Der Bus ist spät.")]
TEST = [("A bird sings.", "Ein Vogel singt."), ("Snow falls.", "Schnee fällt.")]


def write_text(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.write_bytes("".join(line + newline for line in lines).encode("utf-8"))
    return path


def write_gz(path: Path, lines: list[str]) -> Path:
    path.write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode("utf-8"), mtime=0))
    return path


def write_pair(root: Path, name: str, pairs: list[tuple[str, str]], gz: bool = False) -> dict[str, str]:
    """Write `<name>.en` / `<name>.de` (plain or .gz) under root; returns the data.files entry (relative paths)."""
    suffix = ".gz" if gz else ""
    writer = write_gz if gz else write_text
    writer(root / f"{name}.en{suffix}", [s for s, _ in pairs])
    writer(root / f"{name}.de{suffix}", [t for _, t in pairs])
    return {"src": f"{name}.en{suffix}", "tgt": f"{name}.de{suffix}"}


def files_params(files: dict[str, dict[str, str]], **data):
    return parse({"data": {"source": "files", "files": files, **data}})


def corpus_files(root: Path, train: list[tuple[str, str]] = TRAIN) -> dict[str, dict[str, str]]:
    return {
        "train": write_pair(root, "train", train),
        "valid": write_pair(root, "valid", VALID),
        "test": write_pair(root, "test", TEST),
    }


def read_split(paths: Paths, split: str) -> dict[str, list]:
    return pq.read_table(paths.split_file(paths.raw, split)).to_pydict()


# --- files: formats and layout --------------------------------------------------------------------------------


def test_plain_and_gzip_inputs_give_parquet_with_src_tgt_origin_and_one_based_line(tmp_path):
    files = {
        "train": write_pair(tmp_path, "train", TRAIN),
        "valid": write_pair(tmp_path, "valid", VALID, gz=True),
        "test": write_pair(tmp_path, "test", TEST, gz=True),
    }
    paths = Paths(tmp_path)
    metrics = download.run(files_params(files), paths)

    assert metrics == {"source": "files", "train_pairs": len(TRAIN), "valid_pairs": len(VALID), "test_pairs": len(TEST)}
    expected = {"train": (TRAIN, "train.en"), "valid": (VALID, "valid.en.gz"), "test": (TEST, "test.en.gz")}
    for split, (pairs, origin) in expected.items():
        table = pq.read_table(paths.split_file(paths.raw, split))
        assert table.column_names == ["src", "tgt", "origin", "line"]
        rows = table.to_pydict()
        assert list(zip(rows["src"], rows["tgt"], strict=True)) == pairs
        assert rows["line"] == list(range(1, len(pairs) + 1))
        assert set(rows["origin"]) == {origin}


def test_absolute_input_paths_are_used_as_given(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    files = corpus_files(tmp_path)
    files["train"] = {k: str(elsewhere / v) for k, v in write_pair(elsewhere, "abs", TRAIN[:3]).items()}
    project = tmp_path / "project"
    project.mkdir()
    files["valid"] = {k: str(tmp_path / v) for k, v in files["valid"].items()}
    files["test"] = {k: str(tmp_path / v) for k, v in files["test"].items()}

    download.run(files_params(files), Paths(project))

    assert read_split(Paths(project), "train")["src"] == [s for s, _ in TRAIN[:3]]


def test_every_split_besides_train_and_valid_becomes_a_test_split(tmp_path):
    files = corpus_files(tmp_path)
    del files["test"]
    files["newstest2014"] = write_pair(tmp_path, "news", TEST)
    files["flickr_2017"] = write_pair(tmp_path, "flickr", TEST[:1])
    paths = Paths(tmp_path)

    metrics = download.run(files_params(files), paths)

    assert artifacts.test_splits(paths.raw) == ["flickr_2017", "newstest2014"]
    assert metrics["newstest2014_pairs"] == 2 and metrics["flickr_2017_pairs"] == 1
    assert read_split(paths, "flickr_2017")["src"] == ["A bird sings."]


def test_manifest_records_rows_per_split_and_sha256_of_every_input(tmp_path):
    files = corpus_files(tmp_path)
    paths = Paths(tmp_path)
    download.run(files_params(files), paths)

    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["source"] == "files"
    assert manifest["splits"] == {"train": len(TRAIN), "valid": len(VALID), "test": len(TEST)}
    expected = {
        name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        for entry in files.values()
        for name in entry.values()
    }
    recorded = {Path(p).name: digest for p, digest in manifest["inputs"].items()}
    assert recorded == expected


# --- files: what is rejected, and how ---------------------------------------------------------------------------


@pytest.mark.parametrize(("src_lines", "tgt_lines"), [(4, 3), (3, 4), (6, 2), (0, 2)])
def test_misaligned_files_are_rejected_with_both_paths_and_line_counts(tmp_path, src_lines, tgt_lines):
    files = corpus_files(tmp_path)
    write_text(tmp_path / "train.en", [f"sentence {i}" for i in range(src_lines)])
    write_text(tmp_path / "train.de", [f"Satz {i}" for i in range(tgt_lines)])
    paths = Paths(tmp_path)

    with pytest.raises(CorpusMisaligned) as err:
        download.run(files_params(files), paths)

    message = str(err.value)
    assert str(tmp_path / "train.en") in message and str(tmp_path / "train.de") in message
    assert f"has {src_lines} lines" in message and f"has {tgt_lines} lines" in message
    assert (err.value.lines_src, err.value.lines_tgt) == (src_lines, tgt_lines)
    assert not paths.raw.exists()  # nothing half-written is left behind


def test_misalignment_is_found_even_when_the_source_has_exactly_one_extra_line(tmp_path):
    files = corpus_files(tmp_path, train=TRAIN)
    with open(tmp_path / "train.en", "a", encoding="utf-8") as f:
        f.write("One line too many.\n")

    with pytest.raises(CorpusMisaligned, match=f"has {len(TRAIN) + 1} lines.*has {len(TRAIN)} lines"):
        download.run(files_params(files), Paths(tmp_path))


def test_invalid_utf8_is_rejected_naming_the_file_and_the_line(tmp_path):
    files = corpus_files(tmp_path)
    (tmp_path / "train.de").write_bytes(b"Ein Hund.\nZwei Katzen.\n" + b"Gr\xfcn ist die Wiese.\n" + b"x\n" * 3)

    with pytest.raises(InputFileError) as err:
        download.run(files_params(files), Paths(tmp_path))

    assert err.value.line == 3
    assert str(tmp_path / "train.de") in str(err.value) and "line 3" in str(err.value)
    assert "UTF-8" in str(err.value)


def test_a_utf8_bom_on_the_first_line_is_stripped(tmp_path):
    files = corpus_files(tmp_path)
    (tmp_path / "train.en").write_bytes(b"\xef\xbb\xbf" + "".join(s + "\n" for s, _ in TRAIN).encode())
    paths = Paths(tmp_path)
    download.run(files_params(files), paths)

    assert read_split(paths, "train")["src"][0] == TRAIN[0][0]
    assert not any("\ufeff" in s for s in read_split(paths, "train")["src"])


def test_crlf_line_ends_are_removed_from_plain_and_gzip_files(tmp_path):
    files = corpus_files(tmp_path)
    write_text(tmp_path / "train.en", [s for s, _ in TRAIN], newline="\r\n")
    (tmp_path / "test.en.gz").write_bytes(gzip.compress("".join(s + "\r\n" for s, _ in TEST).encode()))
    files["test"] = {"src": "test.en.gz", "tgt": "test.de"}
    paths = Paths(tmp_path)
    download.run(files_params(files), paths)

    assert read_split(paths, "train")["src"] == [s for s, _ in TRAIN]
    assert read_split(paths, "test")["src"] == [s for s, _ in TEST]


def test_an_empty_pair_of_files_is_an_error_naming_the_files(tmp_path):
    files = corpus_files(tmp_path)
    write_text(tmp_path / "valid.en", [])
    write_text(tmp_path / "valid.de", [])

    with pytest.raises(InputFileError) as err:
        download.run(files_params(files), Paths(tmp_path))

    assert str(tmp_path / "valid.en") in str(err.value) and str(tmp_path / "valid.de") in str(err.value)
    assert "empty" in str(err.value)


def test_an_empty_file_next_to_a_non_empty_one_is_reported_with_zero_lines(tmp_path):
    files = corpus_files(tmp_path)
    write_gz(tmp_path / "test.de.gz", [])
    files["test"] = {"src": "test.en", "tgt": "test.de.gz"}

    with pytest.raises(CorpusMisaligned) as err:
        download.run(files_params(files), Paths(tmp_path))

    assert f"{tmp_path / 'test.de.gz'} has 0 lines" in str(err.value)


def test_a_truncated_gzip_is_an_error_naming_the_file(tmp_path):
    real = MULTI30K / "val.en.gz"
    if not real.exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    data = real.read_bytes()
    (tmp_path / "cut.en.gz").write_bytes(data[: len(data) // 2])
    files = corpus_files(tmp_path)
    files["valid"] = {"src": "cut.en.gz", "tgt": str(MULTI30K / "val.de.gz")}

    with pytest.raises(InputFileError) as err:
        download.run(files_params(files), Paths(tmp_path))

    assert str(tmp_path / "cut.en.gz") in str(err.value)
    assert "gzip" in str(err.value)


def test_a_missing_file_is_an_error_naming_its_path(tmp_path):
    files = corpus_files(tmp_path)
    files["test"] = {"src": "test.en", "tgt": "nowhere/test.de"}

    with pytest.raises(InputFileError) as err:
        download.run(files_params(files), Paths(tmp_path))

    assert str(tmp_path / "nowhere" / "test.de") in str(err.value)
    assert "not found" in str(err.value)


def test_max_train_pairs_with_head_keeps_the_first_n_training_pairs_only(tmp_path):
    files = corpus_files(tmp_path)
    paths = Paths(tmp_path)
    metrics = download.run(files_params(files, max_train_pairs=4, subsample="head"), paths)

    train = read_split(paths, "train")
    assert list(zip(train["src"], train["tgt"], strict=True)) == TRAIN[:4]
    assert train["line"] == [1, 2, 3, 4]
    assert metrics["train_pairs"] == 4 and metrics["valid_pairs"] == len(VALID)  # only train is capped


def test_max_train_pairs_spreads_the_subsample_over_every_input_deterministically(tmp_path):
    first = [(f"first {i}", f"erste {i}") for i in range(30)]
    second = [(f"second {i}", f"zweite {i}") for i in range(10)]
    files = corpus_files(tmp_path)
    files["train"] = [write_pair(tmp_path, "a", first), write_pair(tmp_path, "b", second, gz=True)]
    paths = Paths(tmp_path)

    download.run(files_params(files, max_train_pairs=8), paths)
    train = read_split(paths, "train")
    again = Paths(tmp_path / "again")
    absolute = {
        split: [
            {k: str(tmp_path / v) for k, v in e.items()} for e in (entries if isinstance(entries, list) else [entries])
        ]
        for split, entries in files.items()
    }
    download.run(files_params(absolute, max_train_pairs=8), again)

    assert len(train["src"]) == 8
    assert train["origin"].count("a.en") == 6 and train["origin"].count("b.en.gz") == 2  # 30:10 of 40 pairs
    assert train["line"] == [5, 10, 15, 20, 25, 30, 5, 10]  # every fifth pair
    assert read_split(again, "train")["line"] == train["line"]
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["subsample"] == {"max_train_pairs": 8, "method": "spread", "from_pairs": 40}


# --- files: TSV, Moses-style directories, several inputs a split -------------------------------------------------


def test_several_training_inputs_of_every_kind_are_concatenated_keeping_origin_and_line(tmp_path):
    (tmp_path / "moses").mkdir()
    write_pair(tmp_path / "moses", "europarl", TRAIN[:2], gz=True)
    write_pair(tmp_path / "moses", "commoncrawl", TRAIN[2:3])
    write_text(tmp_path / "moses" / "README", ["not a corpus"])
    write_text(tmp_path / "moses" / "europarl.fr", ["pas cette langue"])
    write_text(tmp_path / "news.tsv", [f"{s}\t{t}" for s, t in TRAIN[3:5]])
    files = corpus_files(tmp_path)
    files["train"] = [write_pair(tmp_path, "plain", TRAIN[5:]), {"tsv": "news.tsv"}, {"dir": "moses"}]
    paths = Paths(tmp_path)

    metrics = download.run(files_params(files), paths)

    train = read_split(paths, "train")
    # Directory files pair up by NAME, in NAME order: commoncrawl before europarl.
    expected = TRAIN[5:] + TRAIN[3:5] + TRAIN[2:3] + TRAIN[:2]
    assert list(zip(train["src"], train["tgt"], strict=True)) == expected
    assert list(zip(train["origin"], train["line"], strict=True)) == [
        ("plain.en", 1),
        ("news.tsv", 1),
        ("news.tsv", 2),
        ("moses/commoncrawl.en", 1),
        ("moses/europarl.en.gz", 1),
        ("moses/europarl.en.gz", 2),
    ]
    assert metrics["train_pairs"] == len(TRAIN)
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    hashed = {Path(p).name for p in manifest["inputs"]}
    assert {"plain.en", "plain.de", "news.tsv", "europarl.en.gz", "europarl.de.gz", "commoncrawl.en"} <= hashed
    assert "README" not in hashed and "europarl.fr" not in hashed


def test_a_tsv_names_its_column_languages_so_it_serves_both_directions(tmp_path):
    write_text(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in TRAIN])  # en TAB de
    files = corpus_files(tmp_path)
    files["train"] = {"tsv": "train.tsv", "columns": ["en", "de"]}
    paths = Paths(tmp_path)

    download.run(files_params(files, src_lang="de", tgt_lang="en"), paths)

    train = read_split(paths, "train")
    assert list(zip(train["tgt"], train["src"], strict=True)) == TRAIN


@pytest.mark.parametrize(("line", "columns"), [("only one column", 1), ("a\tb\tc", 3), ("", 1)])
def test_a_tsv_line_without_exactly_one_tab_is_an_error_naming_file_and_line(tmp_path, line, columns):
    write_text(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in TRAIN[:2]] + [line])
    files = corpus_files(tmp_path)
    files["train"] = {"tsv": "train.tsv"}

    with pytest.raises(InputFileError) as err:
        download.run(files_params(files), Paths(tmp_path))

    assert err.value.line == 3 and str(tmp_path / "train.tsv") in str(err.value)
    assert f"expected 2 tab-separated columns, found {columns}" in str(err.value)


def test_a_tsv_with_crlf_and_a_bom_reads_cleanly(tmp_path):
    body = "".join(f"{s}\t{t}\r\n" for s, t in TRAIN).encode()
    (tmp_path / "train.tsv").write_bytes(b"\xef\xbb\xbf" + body)
    files = corpus_files(tmp_path)
    files["train"] = {"tsv": "train.tsv"}
    paths = Paths(tmp_path)
    download.run(files_params(files), paths)
    train = read_split(paths, "train")
    assert list(zip(train["src"], train["tgt"], strict=True)) == TRAIN


def test_a_directory_without_files_of_the_pair_names_the_directory_and_what_it_has(tmp_path):
    (tmp_path / "corpus").mkdir()
    write_text(tmp_path / "corpus" / "europarl.fr", ["Bonjour."])
    write_text(tmp_path / "corpus" / "europarl.es", ["Hola."])
    files = corpus_files(tmp_path)
    files["train"] = {"dir": "corpus"}

    with pytest.raises(InputFileError) as err:
        download.run(files_params(files), Paths(tmp_path))

    message = str(err.value)
    assert str(tmp_path / "corpus") in message and "no NAME.en / NAME.de files" in message
    assert "europarl.fr" in message


def test_a_directory_file_without_its_partner_is_an_error_naming_it(tmp_path):
    (tmp_path / "corpus").mkdir()
    write_pair(tmp_path / "corpus", "europarl", TRAIN)
    write_text(tmp_path / "corpus" / "news.en", ["An orphan."])
    files = corpus_files(tmp_path)
    files["train"] = {"dir": "corpus"}

    with pytest.raises(InputFileError, match=r"news\.en: has no partner news\.de"):
        download.run(files_params(files), Paths(tmp_path))


def test_a_directory_prefix_selects_names_and_a_missing_directory_is_named(tmp_path):
    (tmp_path / "corpus").mkdir()
    write_pair(tmp_path / "corpus", "news-2019", TRAIN[:2])
    write_pair(tmp_path / "corpus", "europarl", TRAIN[2:])
    files = corpus_files(tmp_path)
    files["train"] = {"dir": "corpus", "prefix": "news-"}
    paths = Paths(tmp_path)
    download.run(files_params(files), paths)
    assert read_split(paths, "train")["src"] == [s for s, _ in TRAIN[:2]]

    files["train"] = {"dir": "nowhere"}
    with pytest.raises(InputFileError, match="nowhere: directory not found"):
        download.run(files_params(files), paths)


def test_an_empty_input_among_several_is_an_error_naming_it(tmp_path):
    files = corpus_files(tmp_path)
    files["train"] = [files["train"], write_pair(tmp_path, "empty", [])]

    with pytest.raises(InputFileError, match="empty.en and .*empty.de: empty"):
        download.run(files_params(files), Paths(tmp_path))


def test_every_input_file_is_checked_before_anything_is_read(tmp_path):
    files = corpus_files(tmp_path)
    files["newstest2014"] = {"src": "missing.en", "tgt": "test.de"}
    # The training file is broken too, but the missing test file is reported first: no long read is wasted.
    (tmp_path / "train.de").write_bytes(b"\xff\n")

    with pytest.raises(InputFileError, match="missing.en: file not found"):
        download.run(files_params(files), Paths(tmp_path))


# --- sample -----------------------------------------------------------------------------------------------------


def test_the_sample_source_gives_train_valid_and_test_with_at_least_500_pairs(tmp_path):
    paths = Paths(tmp_path)
    metrics = download.run(parse({"data": {"source": "sample"}}), paths)

    assert sorted(p.stem for p in paths.raw.glob("*.parquet")) == ["test", "train", "valid"]
    sizes = {s: pq.ParquetFile(paths.split_file(paths.raw, s)).metadata.num_rows for s in ("train", "valid", "test")}
    assert all(n > 0 for n in sizes.values())
    assert sum(sizes.values()) >= 500
    assert metrics == {"source": "sample", **{f"{s}_pairs": n for s, n in sizes.items()}}


def test_the_sample_in_the_other_direction_swaps_source_and_target(tmp_path):
    en_de, de_en = Paths(tmp_path / "en-de"), Paths(tmp_path / "de-en")
    download.run(parse({"data": {"source": "sample", "src_lang": "en", "tgt_lang": "de"}}), en_de)
    download.run(parse({"data": {"source": "sample", "src_lang": "de", "tgt_lang": "en"}}), de_en)

    for split in ("train", "valid", "test"):
        forward, backward = read_split(en_de, split), read_split(de_en, split)
        assert forward["src"] == backward["tgt"] and forward["tgt"] == backward["src"]
        assert forward["src"] != forward["tgt"]
    assert "Die" in " ".join(read_split(de_en, "train")["src"])


# --- wmt14 without a hub ----------------------------------------------------------------------------------------


def test_wmt14_with_datasets_offline_fails_at_once_and_points_to_local_files(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    paths = Paths(tmp_path)

    start = time.monotonic()
    with pytest.raises(HubUnreachable) as err:
        download.run(parse({"data": {"source": "wmt14"}}), paths)

    assert time.monotonic() - start < 5
    assert "HF_DATASETS_OFFLINE" in str(err.value)
    assert "data.source: files" in str(err.value)
    assert not paths.raw.exists()


def test_wmt14_without_offline_variables_fails_fast_when_the_hub_cannot_be_reached(tmp_path, monkeypatch):
    # Runs without network: with the offline variables unset, the reachability probe itself must fail quickly
    # (no DNS / no route) instead of entering the datasets library's retry loop.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    paths = Paths(tmp_path)

    start = time.monotonic()
    with pytest.raises(HubUnreachable) as err:
        download.run(parse({"data": {"source": "wmt14"}}), paths)

    assert time.monotonic() - start < 15
    assert "data.source: files" in str(err.value)
    assert not paths.raw.exists()


def test_wmt14_fails_fast_when_the_hub_endpoint_refuses_connections(tmp_path, monkeypatch):
    # Hermetic variant of the test above: the endpoint is a closed local port, so this holds with or without network.
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")

    start = time.monotonic()
    with pytest.raises(HubUnreachable, match="127.0.0.1:9"):
        download.run(parse({"data": {"source": "wmt14"}}), Paths(tmp_path))
    assert time.monotonic() - start < 15


def test_wmt14_reads_the_pair_in_the_configured_direction_at_one_recorded_revision(tmp_path, monkeypatch):
    # The hub is replaced by a fake with the shape `datasets` streams: {"translation": {lang: text}} rows.
    calls = []

    def fake_load(config, split, revision):
        calls.append((config, split, revision))
        size = {"train": 10, "validation": 3, "test": 2}[split]
        rows = [{"translation": {"de": f"Satz {split} {i}", "en": f"sentence {split} {i}"}} for i in range(size)]
        return rows, size

    monkeypatch.setattr(download, "_check_hub_reachable", lambda: None)
    monkeypatch.setattr(download, "_resolve_revision", lambda revision: "0123abc")
    monkeypatch.setattr(download, "_load_wmt14", fake_load)
    paths = Paths(tmp_path)

    metrics = download.run(
        parse({"data": {"source": "wmt14", "src_lang": "de", "tgt_lang": "en", "max_train_pairs": 5}}), paths
    )

    assert metrics == {"source": "wmt14", "train_pairs": 5, "valid_pairs": 3, "newstest2014_pairs": 2}
    assert {c[0] for c in calls} == {"de-en"} and {c[2] for c in calls} == {"0123abc"}
    train = read_split(paths, "train")
    assert train["src"][0] == "Satz train 1" and train["tgt"][0] == "sentence train 1"  # every second of 10
    assert train["line"] == [2, 4, 6, 8, 10] and set(train["origin"]) == {"wmt/wmt14:de-en:train"}
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["revision"] == "0123abc" and manifest["dataset"] == "wmt/wmt14"
    assert manifest["splits"] == {"train": 5, "valid": 3, "newstest2014": 2}


HUB_README = """---
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
  - split: validation
    path: de-en/validation-*
  - split: test
    path: de-en/test-*
dataset_info:
- config_name: de-en
  features:
  - name: translation
    dtype:
      translation:
        languages: [de, en]
  splits:
  - name: train
    num_examples: 12
  - name: validation
    num_examples: 3
  - name: test
    num_examples: 2
---
"""


def test_wmt14_streams_through_datasets_from_a_repository_laid_out_like_the_hubs(tmp_path, monkeypatch):
    # The real `datasets.load_dataset(..., streaming=True)` path, on a local copy of the hub repository's layout
    # (wmt/wmt14: Parquet shards per config and split, configs declared in README.md), since the hub is unreachable.
    from datasets import Dataset, Features, Translation

    mirror = tmp_path / "wmt14"
    features = Features({"translation": Translation(languages=["de", "en"])})
    sizes = {"train": 12, "validation": 3, "test": 2}
    for split, size in sizes.items():
        rows = [{"de": f"Satz {split} {i}", "en": f"sentence {split} {i}"} for i in range(size)]
        (mirror / "de-en").mkdir(parents=True, exist_ok=True)
        Dataset.from_dict({"translation": rows}, features=features).to_parquet(
            mirror / "de-en" / f"{split}-00000-of-00001.parquet"
        )
    (mirror / "README.md").write_text(HUB_README, encoding="utf-8")
    monkeypatch.setattr(download, "WMT14_DATASET", str(mirror))
    monkeypatch.setattr(download, "_check_hub_reachable", lambda: None)
    monkeypatch.setattr(download, "_resolve_revision", lambda revision: None)
    paths = Paths(tmp_path / "project")

    metrics = download.run(parse({"data": {"source": "wmt14", "max_train_pairs": 4}}), paths)

    assert metrics == {"source": "wmt14", "train_pairs": 4, "valid_pairs": 3, "newstest2014_pairs": 2}
    train = read_split(paths, "train")
    # en -> de from the de-en config; 4 of the 12 the card states, spread evenly (every third row).
    assert train["src"] == [f"sentence train {i}" for i in (2, 5, 8, 11)]
    assert train["tgt"] == [f"Satz train {i}" for i in (2, 5, 8, 11)]
    assert train["line"] == [3, 6, 9, 12] and set(train["origin"]) == {f"{mirror}:de-en:train"}
    assert read_split(paths, "newstest2014")["src"] == ["sentence test 0", "sentence test 1"]
