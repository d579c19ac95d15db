"""download stage: aligned text files (plain or .gz), the embedded sample and WMT14 (the hub source's preset) into
`data/raw/<split>.parquet`."""

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
from pipeline.errors import CorpusMisaligned, HubUnreachable
from pipeline.params import HUB_PRESETS, parse
from pipeline.runtime.errors import InputFileError, PipelineError
from stages import download
from tests.conftest import MULTI30K
from tests.support.hub_layouts import redirect_hub, write_translation_repo

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


def test_plain_and_gzip_inputs_give_parquet_with_languages_origin_and_one_based_line(tmp_path):
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
        assert table.column_names == ["src", "tgt", "src_lang", "tgt_lang", "origin", "line"]
        rows = table.to_pydict()
        assert set(rows["src_lang"]) == {"en"} and set(rows["tgt_lang"]) == {"de"}
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
    assert manifest["source"] == "files" and manifest["directions"] == ["en-de"]
    assert manifest["splits"] == {"train": len(TRAIN), "valid": len(VALID), "test": len(TEST)}
    assert manifest["rows_per_direction"] == {s: {"en-de": n} for s, n in manifest["splits"].items()}
    assert "src_lang" not in manifest and "tgt_lang" not in manifest
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
    assert manifest["subsample"] == {"en-de": {"max_train_pairs": 8, "method": "spread", "from_pairs": 40}}


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

    download.run(files_params(files, directions=["de-en"]), paths)

    train = read_split(paths, "train")
    assert list(zip(train["tgt"], train["src"], strict=True)) == TRAIN
    assert set(train["src_lang"]) == {"de"} and set(train["tgt_lang"]) == {"en"}


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
    download.run(parse({"data": {"source": "sample", "directions": ["en-de"]}}), en_de)
    download.run(parse({"data": {"source": "sample", "directions": ["de-en"]}}), de_en)

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
    # wmt/wmt14 resolves to one commit, and its files come from a local copy of the hub repository's layout.
    mirror = write_translation_repo(tmp_path / "wmt14", ["de-en"], {"train": 10, "validation": 3, "test": 2})
    calls = redirect_hub(monkeypatch, mirror, "0123abc")
    paths = Paths(tmp_path)

    metrics = download.run(
        parse({"data": {"source": "wmt14", "directions": ["de-en"], "max_train_pairs": 5}}), paths
    )

    assert metrics == {"source": "wmt14", "train_pairs": 5, "valid_pairs": 3, "newstest2014_pairs": 2}
    assert calls and set(calls) == {("wmt/wmt14", "0123abc")}
    train = read_split(paths, "train")
    assert train["src"][0] == "de train 1" and train["tgt"][0] == "en train 1"  # every second of 10
    assert train["line"] == [2, 4, 6, 8, 10] and set(train["origin"]) == {"wmt/wmt14:de-en:train"}
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["revision"] == "0123abc" and manifest["dataset"] == "wmt/wmt14"
    assert manifest["configs"] == {"de-en": "de-en"}
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
    # data.source: wmt14 is a preset of the hub source: pointing the preset at the local copy reads it offline.
    monkeypatch.setitem(HUB_PRESETS["wmt14"], "path", str(mirror))
    paths = Paths(tmp_path / "project")

    metrics = download.run(parse({"data": {"source": "wmt14", "max_train_pairs": 4}}), paths)

    assert metrics == {"source": "wmt14", "train_pairs": 4, "valid_pairs": 3, "newstest2014_pairs": 2}
    train = read_split(paths, "train")
    # en -> de from the de-en config; 4 of the 12 the card states, spread evenly (every third row).
    assert train["src"] == [f"sentence train {i}" for i in (2, 5, 8, 11)]
    assert train["tgt"] == [f"Satz train {i}" for i in (2, 5, 8, 11)]
    assert train["line"] == [3, 6, 9, 12] and set(train["origin"]) == {f"{mirror}:de-en:train"}
    assert read_split(paths, "newstest2014")["src"] == ["sentence test 0", "sentence test 1"]


# --- several directions ---------------------------------------------------------------------------------------

FRENCH = {  # the French of TRAIN, VALID and TEST, line by line
    "train": ["Un chien court dans le parc.", "Deux enfants jouent au football.", "La femme lit un livre.",
              "Un homme roule sur un vélo rouge.", "Le soleil brille.", "Un chat dort sur le canapé."],
    "valid": ["Il pleut.", "Le bus est en retard."],
    "test": ["Un oiseau chante.", "La neige tombe."],
}
SPLITS = {"train": TRAIN, "valid": VALID, "test": TEST}


def write_languages(root: Path, split: str, drop: str | None = None) -> dict[str, str]:
    """`<split>.en`, `<split>.de` and `<split>.fr` (line-aligned; `drop` left unwritten); the {pattern} entry."""
    lines = {"en": [s for s, _ in SPLITS[split]], "de": [t for _, t in SPLITS[split]], "fr": FRENCH[split]}
    for lang, text in lines.items():
        if lang != drop:
            write_text(root / f"{split}.{lang}", text)
    return {"pattern": f"{split}.{{lang}}"}


def multi_params(files, directions=("en-de", "en-fr"), **data):
    return files_params(files, directions=list(directions), **data)


def rows_of(paths: Paths, split: str) -> list[tuple]:
    table = read_split(paths, split)
    return list(zip(table["src_lang"], table["tgt_lang"], table["src"], table["tgt"], table["line"], strict=True))


def test_a_pattern_entry_gives_every_direction_its_two_languages_files_direction_by_direction(tmp_path):
    files = {split: write_languages(tmp_path, split) for split in SPLITS}
    paths = Paths(tmp_path)

    metrics = download.run(multi_params(files), paths)

    for split, pairs in SPLITS.items():
        n = len(pairs)
        expected = [("en", "de", s, t, i + 1) for i, (s, t) in enumerate(pairs)]
        expected += [("en", "fr", s, f, i + 1) for i, ((s, _), f) in enumerate(zip(pairs, FRENCH[split], strict=True))]
        assert rows_of(paths, split) == expected  # kept rows = input rows, per direction, in data.directions order
        assert set(read_split(paths, split)["origin"]) == {f"{split}.en"}
        assert metrics[f"{split}_pairs"] == 2 * n
    assert metrics["train_pairs_en-de"] == metrics["train_pairs_en-fr"] == len(TRAIN)
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["directions"] == ["en-de", "en-fr"]
    assert manifest["rows_per_direction"] == {s: {"en-de": len(p), "en-fr": len(p)} for s, p in SPLITS.items()}
    assert manifest["splits"] == {s: 2 * len(p) for s, p in SPLITS.items()}
    hashed = sorted(Path(p).name for p in manifest["inputs"])  # each file once, though both directions read en
    assert hashed == sorted(f"{split}.{lang}" for split in SPLITS for lang in ("en", "de", "fr"))


def test_a_tsv_with_columns_serves_the_direction_and_its_reverse_swapping_columns(tmp_path):
    write_text(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in TRAIN])  # en TAB de
    write_text(tmp_path / "valid.tsv", [f"{t}\t{s}" for s, t in VALID])  # de TAB en
    files = {
        "train": {"tsv": "train.tsv", "columns": ["en", "de"]},
        "valid": {"tsv": "valid.tsv", "columns": ["de", "en"]},
        "test": {"tsv": "valid.tsv", "columns": ["de", "en"]},
    }
    paths = Paths(tmp_path)

    download.run(multi_params(files, directions=["de-en", "en-de"]), paths)

    train = rows_of(paths, "train")
    assert train == [("de", "en", t, s, i + 1) for i, (s, t) in enumerate(TRAIN)] + [
        ("en", "de", s, t, i + 1) for i, (s, t) in enumerate(TRAIN)
    ]
    assert [(a, b, s, t) for a, b, s, t, _ in rows_of(paths, "valid")] == [("de", "en", t, s) for s, t in VALID] + [
        ("en", "de", s, t) for s, t in VALID
    ]


def test_split_files_name_their_direction_and_rows_follow_the_order_of_data_directions(tmp_path):
    for split in SPLITS:
        write_languages(tmp_path, split)
    files = {
        split: [
            {"src": f"{split}.en", "tgt": f"{split}.fr", "direction": "en-fr"},
            {"src": f"{split}.de", "tgt": f"{split}.en", "direction": "de-en"},
        ]
        for split in SPLITS
    }
    paths = Paths(tmp_path)

    download.run(multi_params(files, directions=["de-en", "en-fr"]), paths)

    train = rows_of(paths, "train")
    assert [(a, b) for a, b, *_ in train] == [("de", "en")] * len(TRAIN) + [("en", "fr")] * len(TRAIN)
    assert train[0][2:4] == (TRAIN[0][1], TRAIN[0][0]) and train[len(TRAIN)][2:4] == (TRAIN[0][0], FRENCH["train"][0])


def test_a_missing_language_file_is_an_error_naming_the_file_and_the_direction(tmp_path):
    files = {split: write_languages(tmp_path, split, drop="fr" if split == "valid" else None) for split in SPLITS}
    paths = Paths(tmp_path)

    with pytest.raises(InputFileError) as err:
        download.run(multi_params(files), paths)

    assert str(tmp_path / "valid.fr") in str(err.value) and "file not found" in str(err.value)
    assert "direction en-fr" in str(err.value) and "data.files.valid" in str(err.value)
    assert not paths.raw.exists()


def test_misaligned_language_files_are_an_error_naming_both_files_and_the_direction(tmp_path):
    files = {split: write_languages(tmp_path, split) for split in SPLITS}
    write_text(tmp_path / "train.fr", FRENCH["train"][:-1])

    with pytest.raises(CorpusMisaligned) as err:
        download.run(multi_params(files), Paths(tmp_path))

    message = str(err.value)
    assert str(tmp_path / "train.en") in message and str(tmp_path / "train.fr") in message
    assert "direction en-fr" in message and (err.value.lines_src, err.value.lines_tgt) == (len(TRAIN), len(TRAIN) - 1)


def test_a_direction_without_a_valid_input_is_an_error_naming_it_and_the_split(tmp_path):
    for split in SPLITS:
        write_languages(tmp_path, split)
    files = {split: {"pattern": f"{split}.{{lang}}"} for split in SPLITS}
    files["valid"] = {"src": "valid.en", "tgt": "valid.de", "direction": "en-de"}
    paths = Paths(tmp_path)

    with pytest.raises(PipelineError, match="direction en-fr has no input in split valid: data.files.valid serves en-"):
        download.run(multi_params(files), paths)
    assert not paths.raw.exists()


def test_a_direction_without_any_test_input_is_an_error_naming_it(tmp_path):
    for split in SPLITS:
        write_languages(tmp_path, split)
    files = {split: {"pattern": f"{split}.{{lang}}"} for split in SPLITS}
    files["test"] = {"src": "test.en", "tgt": "test.fr", "direction": "en-fr"}

    with pytest.raises(PipelineError, match=r"direction en-de has no input in any test split \(test\)"):
        download.run(multi_params(files), Paths(tmp_path))


def test_a_test_split_may_hold_some_of_the_directions_only(tmp_path):
    files = {split: write_languages(tmp_path, split) for split in SPLITS}
    files["flickr"] = {"src": "test.en", "tgt": "test.fr", "direction": "en-fr"}
    paths = Paths(tmp_path)

    metrics = download.run(multi_params(files), paths)

    assert {(a, b) for a, b, *_ in rows_of(paths, "flickr")} == {("en", "fr")}
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["rows_per_direction"]["flickr"] == {"en-fr": len(TEST)} and metrics["flickr_pairs"] == len(TEST)


def test_max_train_pairs_caps_every_direction_on_its_own(tmp_path):
    german = [(f"sentence {i}", f"Satz {i}") for i in range(30)]
    french = [(f"sentence {i}", f"phrase {i}") for i in range(10)]
    write_text(tmp_path / "fr.en", [s for s, _ in french])
    write_text(tmp_path / "fr.fr", [t for _, t in french])
    to_french = {"src": "fr.en", "tgt": "fr.fr", "direction": "en-fr"}
    files = {split: [entry | {"direction": "en-de"}, to_french] for split, entry in corpus_files(tmp_path).items()}
    files["train"][0] = write_pair(tmp_path, "de", german) | {"direction": "en-de"}
    paths = Paths(tmp_path)

    metrics = download.run(multi_params(files, max_train_pairs=5), paths)

    train = read_split(paths, "train")
    by_direction = {d: [n for n, a, b in zip(train["line"], train["src_lang"], train["tgt_lang"], strict=True)
                        if f"{a}-{b}" == d] for d in ("en-de", "en-fr")}
    assert by_direction == {"en-de": [6, 12, 18, 24, 30], "en-fr": [2, 4, 6, 8, 10]}  # spread within each direction
    assert metrics["train_pairs_en-de"] == metrics["train_pairs_en-fr"] == 5 and metrics["train_pairs"] == 10
    assert metrics["valid_pairs"] == len(VALID) + len(french)  # only train is capped
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["subsample"] == {
        "en-de": {"max_train_pairs": 5, "method": "spread", "from_pairs": 30},
        "en-fr": {"max_train_pairs": 5, "method": "spread", "from_pairs": 10},
    }

    download.run(multi_params(files, max_train_pairs=3, subsample="head"), paths)
    assert read_split(paths, "train")["line"] == [1, 2, 3, 1, 2, 3]


def test_a_moses_directory_serves_each_direction_its_pairs_and_nothing_to_a_language_it_lacks(tmp_path):
    (tmp_path / "moses").mkdir()
    for lang, text in {"en": TRAIN[:2], "de": TRAIN[:2]}.items():
        write_text(tmp_path / "moses" / f"europarl.{lang}", [p[0] if lang == "en" else p[1] for p in text])
    write_text(tmp_path / "moses" / "europarl.fr", FRENCH["train"][:2])
    write_text(tmp_path / "cs.en", ["A house."])
    write_text(tmp_path / "cs.cs", ["Dům."])
    cs = {"src": "cs.en", "tgt": "cs.cs", "direction": "en-cs"}
    files: dict[str, list] = {"train": [{"dir": "moses"}, cs]}
    for split in ("valid", "test"):
        write_languages(tmp_path, split)
        to = [{"src": f"{split}.en", "tgt": f"{split}.{lang}", "direction": f"en-{lang}"} for lang in ("de", "fr")]
        files[split] = [*to, cs]
    paths = Paths(tmp_path)

    download.run(multi_params(files, directions=["en-de", "en-fr", "en-cs"]), paths)

    train = rows_of(paths, "train")
    assert [(a, b, t) for a, b, _, t, _ in train] == [
        ("en", "de", TRAIN[0][1]), ("en", "de", TRAIN[1][1]),
        ("en", "fr", FRENCH["train"][0]), ("en", "fr", FRENCH["train"][1]),
        ("en", "cs", "Dům."),
    ]

    write_text(tmp_path / "moses" / "news.en", ["An orphan."])
    write_text(tmp_path / "moses" / "news.de", ["Eine Waise."])
    with pytest.raises(InputFileError, match=r"news\.en: has no partner news\.fr"):
        download.run(multi_params(files, directions=["en-de", "en-fr", "en-cs"]), paths)


def test_the_sample_gives_both_of_its_directions_in_one_file_per_split(tmp_path):
    paths = Paths(tmp_path)
    metrics = download.run(parse({"data": {"source": "sample", "directions": ["en-de", "de-en"]}}), paths)

    for split in ("train", "valid", "test"):
        rows = read_split(paths, split)
        half = len(rows["src"]) // 2
        assert rows["src_lang"] == ["en"] * half + ["de"] * half
        assert rows["src"][:half] == rows["tgt"][half:] and rows["tgt"][:half] == rows["src"][half:]
    assert metrics["train_pairs_en-de"] == metrics["train_pairs_de-en"] == metrics["train_pairs"] // 2


def test_wmt14_reads_each_direction_from_its_config_in_its_orientation_into_one_file(tmp_path, monkeypatch):
    mirror = write_translation_repo(tmp_path / "wmt14", ["de-en", "ru-en", "fr-en"],
                                    {"train": 6, "validation": 2, "test": 1})
    calls = redirect_hub(monkeypatch, mirror, "0123abc")
    paths = Paths(tmp_path)

    data = {"source": "wmt14", "directions": ["en-de", "ru-en"], "max_train_pairs": 3}
    metrics = download.run(parse({"data": data}), paths)

    assert {revision for _, revision in calls} == {"0123abc"}
    assert metrics == {"source": "wmt14", "train_pairs": 6, "valid_pairs": 4, "newstest2014_pairs": 2,
                       "train_pairs_en-de": 3, "train_pairs_ru-en": 3}
    train = rows_of(paths, "train")
    assert [(a, b, s, t) for a, b, s, t, _ in train] == [
        ("en", "de", f"en train {i}", f"de train {i}") for i in (1, 3, 5)
    ] + [("ru", "en", f"ru train {i}", f"en train {i}") for i in (1, 3, 5)]
    assert set(read_split(paths, "newstest2014")["origin"]) == {"wmt/wmt14:de-en:test", "wmt/wmt14:ru-en:test"}
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["rows_per_direction"]["valid"] == {"en-de": 2, "ru-en": 2}
    assert manifest["configs"] == {"en-de": "de-en", "ru-en": "ru-en"}
    assert set(manifest["subsample"]) == {"en-de", "ru-en"}


def test_wmt14_config_is_the_pair_with_english_whatever_the_orientation():
    from pipeline.runtime.languages import Direction
    from stages.download.hub import choose_config

    configs = ["cs-en", "de-en", "fr-en", "hi-en", "ru-en"]
    directions = ("en-cs", "cs-en", "hi-en", "en-ru")
    chosen = [choose_config(Direction.parse(d), configs, None, "wmt/wmt14") for d in directions]
    assert chosen == ["cs-en", "cs-en", "hi-en", "ru-en"]
