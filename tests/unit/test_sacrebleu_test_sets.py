"""evaluate.sacrebleu_test_sets: sacreBLEU's test sets become test splits, fetched through sacreBLEU's own
downloader from a cache prepared as a download leaves it (the SACREBLEU directory: the archive, its extracted files;
nothing is fetched over the network), cleaned like every split and scored with the signature sacreBLEU's CLI prints."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import artifacts
from pipeline.artifacts import Paths
from pipeline.params import parse
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import Directions
from pipeline.sacrebleu_sets import check_test_sets, split_name
from stages import check_params, clean, download

# Plain sentences that cleaning leaves as they are, so the cleaned references are sacreBLEU's.
SOURCES = ["A dog runs in the park.", "Two children play football on the beach.", "The sun is shining today.",
           "A man rides a red bicycle.", "The woman reads a book in the garden."]
REFERENCES = ["Ein Hund rennt im Park.", "Zwei Kinder spielen Fußball am Strand.", "Die Sonne scheint heute.",
              "Ein Mann fährt ein rotes Fahrrad.", "Die Frau liest ein Buch im Garten."]
HYPOTHESES = ["Ein Hund läuft im Park.", "Zwei Kinder spielen am Strand Fußball.", "Heute scheint die Sonne.",
              "Ein Mann fährt ein rotes Rad.", "Die Frau liest im Garten ein Buch."]


def _sgm(kind: str, lines: list[str]) -> str:
    segs = "\n".join(f'<seg id="{i}">{line}</seg>' for i, line in enumerate(lines, start=1))
    return (f'<{kind}set setid="newstest2014" srclang="any">\n<doc sysid="ref" docid="1-news" genre="news" '
            f'origlang="en">\n<p>\n{segs}\n</p>\n</doc>\n</{kind}set>\n')


def _archive(raw: Path, name: str, folder: str) -> None:
    """The archive sacreBLEU downloaded beside what it extracted: its presence tells sacreBLEU not to download."""
    with tarfile.open(raw / name, "w:gz") as tar:
        tar.add(raw / folder, arcname=folder)


def prepare_wmt14(cache: Path) -> Path:
    """SACREBLEU/wmt14 as `sacrebleu -t wmt14 -l en-de` leaves it after downloading test-filtered.tgz (en-de only)."""
    raw = cache / "wmt14" / "raw"
    (raw / "test").mkdir(parents=True)
    (raw / "test" / "newstest2014-deen-src.en.sgm").write_text(_sgm("src", SOURCES), encoding="utf-8")
    (raw / "test" / "newstest2014-deen-ref.de.sgm").write_text(_sgm("ref", REFERENCES), encoding="utf-8")
    _archive(raw, "wmt14.test-filtered.tgz", "test")
    return cache


def prepare_multi30k_2016(cache: Path) -> Path:
    """SACREBLEU/multi30k/2016, a plain-text set, as sacreBLEU leaves it (en-de)."""
    raw = cache / "multi30k" / "2016" / "raw"
    raw.mkdir(parents=True)
    (raw / "test_2016_flickr.en").write_text("".join(f"{s}\n" for s in SOURCES[:3]), encoding="utf-8")
    (raw / "test_2016_flickr.de").write_text("".join(f"{s}\n" for s in REFERENCES[:3]), encoding="utf-8")
    with tarfile.open(raw / "multi30k_2016.multi30k_test_sets_d3ec2a38.tar.gz", "w:gz") as tar:
        tar.add(raw / "test_2016_flickr.en", arcname="test_2016_flickr.en")
    return cache


@pytest.fixture
def sacrebleu_cache(tmp_path, monkeypatch) -> Path:
    cache = prepare_multi30k_2016(prepare_wmt14(tmp_path / "sacrebleu"))
    monkeypatch.setenv("SACREBLEU", str(cache))
    return cache


def sample_with(test_sets: list[str], directions: list[str] | None = None):
    return parse({"data": {"source": "sample", "directions": directions or ["en-de"]},
                  "evaluate": {"sacrebleu_test_sets": test_sets}})


def split_rows(directory: Path, split: str) -> dict[str, list]:
    return pq.read_table(directory / f"{split}.parquet").to_pydict()


# --- download --------------------------------------------------------------------------------------------------


def test_each_test_set_becomes_a_test_split_beside_the_datas_own(tmp_path, sacrebleu_cache):
    paths = Paths(tmp_path / "project")

    metrics = download.run(sample_with(["wmt14", "multi30k/2016"]), paths)

    assert artifacts.test_splits(paths.raw) == ["multi30k_2016", "test", "wmt14"]
    assert metrics["wmt14_pairs"] == 5 and metrics["multi30k_2016_pairs"] == 3
    wmt14 = split_rows(paths.raw, "wmt14")
    assert wmt14["src"] == SOURCES and wmt14["tgt"] == REFERENCES and wmt14["line"] == [1, 2, 3, 4, 5]
    assert set(wmt14["origin"]) == {"sacrebleu:wmt14:en-de"}
    manifest = json.loads((paths.raw / "manifest.json").read_text(encoding="utf-8"))
    # The manifest pins the files sacreBLEU wrote from its archive: the text it scores itself.
    ref_file = sacrebleu_cache / "multi30k" / "2016" / "multi30k_2016.en-de.ref"
    assert manifest["sacrebleu_test_sets"]["multi30k/2016"] == {
        "split": "multi30k_2016",
        "files": {"en-de": {"src": hashlib.sha256(ref_file.with_suffix(".src").read_bytes()).hexdigest(),
                            "ref": hashlib.sha256(ref_file.read_bytes()).hexdigest()}},
    }
    assert manifest["splits"]["wmt14"] == 5


def test_the_stage_scores_a_test_set_as_the_sacrebleu_cli_does(tmp_path, sacrebleu_cache):
    from stages.evaluate import score

    paths = Paths(tmp_path)
    params = sample_with(["wmt14"])
    download.run(params, paths)
    clean.run(params, paths)
    references = split_rows(paths.clean, "wmt14")["tgt"]
    assert references == REFERENCES  # cleaning left them as sacreBLEU gives them
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("".join(f"{h}\n" for h in HYPOTHESES), encoding="utf-8")

    # TER: the stage scores case-sensitive TER (the CLI's default lowercases), the CLI is asked for the same.
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", "-t", "wmt14", "-l", "en-de", "-i", str(hyp), "-m", "bleu", "chrf", "ter",
         "--ter-case-sensitive", "-w", "2"],
        capture_output=True, text=True, check=True,
    )
    printed = {entry["name"]: entry for entry in json.loads(cli.stdout)}
    ours = score(HYPOTHESES, references)

    assert ours["bleu"] == pytest.approx(printed["BLEU"]["score"], abs=0.005)
    assert ours["chrf"] == pytest.approx(printed["chrF2"]["score"], abs=0.005)
    assert ours["ter"] == pytest.approx(printed["TER"]["score"], abs=0.005)
    assert ours["signature"] == {"bleu": printed["BLEU"]["signature"], "chrf": printed["chrF2"]["signature"],
                                 "ter": printed["TER"]["signature"]}
    assert 0 < ours["bleu"] < 100


def test_a_pair_missing_from_an_offline_cache_stops_the_stage_before_any_work_saying_how_to_fetch_it(
    tmp_path, sacrebleu_cache
):
    # The wmt14 archive is in the cache, so sacreBLEU does not download; de-en's files are not among those extracted.
    paths = Paths(tmp_path / "project")

    with pytest.raises(PipelineError) as err:
        download.run(sample_with(["wmt14"], ["de-en"]), paths)

    message = str(err.value)
    assert message.startswith("evaluate.sacrebleu_test_sets: sacreBLEU could not fetch wmt14 de-en")
    assert "newstest2014-deen-src.de.sgm" in message
    assert "`python -m sacrebleu -t wmt14 -l de-en --echo src`" in message and str(sacrebleu_cache) in message
    assert not paths.raw.exists()


# --- what sacreBLEU's table says, before any work ---------------------------------------------------------------


def test_a_test_set_sacrebleu_does_not_know_stops_check_params_listing_those_it_has(tmp_path):
    paths = Paths(tmp_path)

    with pytest.raises(PipelineError) as err:
        check_params.run(sample_with(["wmt14/ful"]), paths)

    message = str(err.value)
    assert "sacreBLEU has no test set 'wmt14/ful' (did you mean wmt14/full" in message
    assert "; it has " in message and "multi30k/2016" in message and "wmt20/robust/set1" in message
    assert not paths.params_checked.exists()


def test_a_direction_a_test_set_has_no_references_for_is_named_with_its_language_pairs(tmp_path):
    with pytest.raises(PipelineError, match="multi30k/2016 has no references for de-en; its language pairs are "
                                            "en-cs, en-de, en-fr"):
        check_params.run(sample_with(["multi30k/2016"], ["en-de", "de-en"]), Paths(tmp_path))


def test_a_test_set_whose_split_the_data_already_has_is_refused():
    with pytest.raises(PipelineError, match="wmt17/ms becomes split 'wmt17_ms', which the data already has"):
        check_test_sets(["wmt17/ms"], Directions.of(["zh-en"]), ["train", "valid", "wmt17_ms"])


def test_split_names_write_slash_and_dot_as_underscore():
    assert [split_name(n) for n in ("wmt14", "wmt20/robust/set1", "mtnt1.1/test")] == [
        "wmt14", "wmt20_robust_set1", "mtnt1_1_test"
    ]


def test_a_test_set_listed_twice_is_refused_by_the_schema():
    from pipeline.params import ParamsError

    with pytest.raises(ParamsError, match=r"\['wmt14'\] listed twice"):
        sample_with(["wmt14", "wmt19", "wmt14"])
