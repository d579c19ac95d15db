"""bench/averaging.py runs as bench/README.md prints it and reproduces the evaluate stage: averaging the last K
snapshots with K = train.average_last translates exactly as models/final does, scored the stage's way; `--until`
averages as the same run stopped at that update does; and a K, a split or an update the run does not have exits
naming what it has. The recipe figures in bench/README.md rest on this."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.artifacts import Paths
from pipeline.corpus import read_pairs_by_direction
from pipeline.params import parse
from pipeline.runtime.model_languages import ModelLanguages
from stages import tokenize, train
from tests.conftest import REPO, bench_module, multi30k_lines, write_clean_splits

pytestmark = pytest.mark.e2e

# A tiny model trained 300 updates, a snapshot every 100: models/final is the mean of updates 100, 200 and 300.
# Fewer updates or a narrower model translate every sentence as the same empty or repeated word, whatever the
# weights averaged, and the comparisons below would prove nothing.
PARAMS = {
    "tokenize": {"vocab_size": 500},
    "model": {"preset": "tiny", "d_model": 64, "ffn_dim": 128, "encoder_layers": 1, "decoder_layers": 1,
              "attention_heads": 2},
    "train": {"max_steps": 300, "valid_every": 150, "save_every": 100, "average_last": 3, "lr": 3e-3,
              "warmup_steps": 10, "max_tokens": 1024, "threads": 1, "valid_bleu_sentences": 0, "precision": "fp32"},
    "evaluate": {"beam": 2},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("averaging-run")
    write_clean_splits(root, {"train": 1500, "valid": 60, "test": 40})
    params = parse(PARAMS)
    tokenize.run(params, Paths(root))
    train.run(params, Paths(root))
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS), encoding="utf-8")
    return root


def stage_translations(run: Path, decoding: dict | None = None, last: int | None = None) -> tuple[list[str], list[str]]:
    """The evaluate stage's translations of the run's test split and their references: with models/final's
    weights, or the last `last` snapshots averaged; with PARAMS' decoding, or `decoding` in its place."""
    from stages.evaluate import load_model, translate
    from stages.train.checkpoint import average_snapshots

    paths = Paths(run)
    model, tokenizer = load_model(paths.final_model)
    if last is not None:
        model.load_state_dict(average_snapshots(paths.checkpoints, last)[0])
    layout = ModelLanguages.read(paths.final_model).layout("en-de")
    sources, refs = read_pairs_by_direction(paths.split_file(paths.clean, "test"))["en-de"][1:]
    settings = parse({**PARAMS, "evaluate": decoding or PARAMS["evaluate"]}).evaluate
    return translate(model, tokenizer, layout, sources, settings, progress_bar=False), refs


def lines(hyps: list[str]) -> str:
    return "".join(f"{h}\n" for h in hyps)


def averaging(run: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bench" / "averaging.py"), "--run", str(run), "--threads", "1",
                           *args], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={"HF_HUB_OFFLINE": "1", "PATH": ""})


def test_averaging_all_the_snapshots_gives_the_evaluate_stages_translations_and_bleu(run_dir, tmp_path):
    from stages.evaluate import score

    result = averaging(run_dir, "--last", "1", "3", "--split", "test", "--hyp-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["snapshots"] == 3 and figures["split"] == "test" and figures["beam"] == 2
    assert (figures["last_1"]["first_update"], figures["last_1"]["last_update"]) == (300, 300)
    assert (figures["last_3"]["first_update"], figures["last_3"]["last_update"]) == (100, 300)

    # What the evaluate stage does with models/final (the mean of the same three snapshots).
    hyps, refs = stage_translations(run_dir)
    assert (tmp_path / "test.en-de.last3.hyp.txt").read_text(encoding="utf-8") == lines(hyps)
    assert figures["last_3"]["bleu"]["en-de"] == score(hyps, refs)["bleu"]
    # --last 1 is update 300's weights alone, and translates otherwise than the average.
    hyps, refs = stage_translations(run_dir, last=1)
    assert (tmp_path / "test.en-de.last1.hyp.txt").read_text(encoding="utf-8") == lines(hyps)
    assert figures["last_1"]["bleu"]["en-de"] == score(hyps, refs)["bleu"]
    assert (tmp_path / "test.en-de.last1.hyp.txt").read_bytes() != (tmp_path / "test.en-de.last3.hyp.txt").read_bytes()


def test_a_k_beyond_the_snapshots_or_an_unknown_split_exits_naming_what_the_run_has(run_dir):
    too_many = averaging(run_dir, "--last", "4")
    assert too_many.returncode != 0 and "--last 4" in too_many.stderr and "holds 3 snapshots" in too_many.stderr
    unknown = averaging(run_dir, "--last", "1", "--split", "test_2017_flickr")
    assert unknown.returncode != 0 and "--split test_2017_flickr" in unknown.stderr
    assert "test" in unknown.stderr.split("the run has", 1)[1] and "Traceback" not in unknown.stderr


def test_beam_and_length_penalty_options_decode_as_the_stage_would_with_those_settings(run_dir, tmp_path):
    result = averaging(run_dir, "--last", "3", "--split", "test", "--beam", "1", "--length-penalty", "0.5",
                       "--hyp-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert (figures["beam"], figures["length_penalty"]) == (1, 0.5)
    greedy, _ = stage_translations(run_dir, {"beam": 1, "length_penalty": 0.5})
    assert (tmp_path / "test.en-de.last3.hyp.txt").read_text(encoding="utf-8") == lines(greedy)
    assert greedy != stage_translations(run_dir)[0]

    invalid = averaging(run_dir, "--last", "1", "--beam", "0", "--length-penalty", "1.3")
    assert invalid.returncode != 0 and "--beam 0" in invalid.stderr and "Traceback" not in invalid.stderr
    assert "--length-penalty" not in invalid.stderr, "only the option at fault is named"


def test_until_averages_what_the_same_run_stopped_at_that_update_would_have(run_dir, tmp_path):
    # The same settings stopped at update 200, averaging its last 2 snapshots (100 and 200) into models/final.
    short = tmp_path / "short"
    write_clean_splits(short, {"train": 1500, "valid": 60, "test": 40})
    params = parse({**PARAMS, "train": {**PARAMS["train"], "max_steps": 200, "average_last": 2}})
    tokenize.run(params, Paths(short))
    train.run(params, Paths(short))

    result = averaging(run_dir, "--until", "200", "--last", "1", "2", "--split", "test", "--hyp-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["until"] == 200 and figures["snapshots"] == 2
    assert (figures["last_2"]["first_update"], figures["last_2"]["last_update"]) == (100, 200)
    hyps, _ = stage_translations(short)  # the shorter run's models/final
    assert (tmp_path / "test.en-de.last2.hyp.txt").read_text(encoding="utf-8") == lines(hyps)
    assert hyps != stage_translations(run_dir)[0], "update 300 changed the model: the comparison means something"


def test_until_refuses_an_update_without_a_snapshot_and_a_decaying_schedule(run_dir, tmp_path):
    between = averaging(run_dir, "--until", "150", "--last", "1")
    assert between.returncode != 0 and "--until 150" in between.stderr and "100-300" in between.stderr
    too_few = averaging(run_dir, "--until", "200", "--last", "3")
    assert too_few.returncode != 0 and "holds 2 snapshots up to update 200" in too_few.stderr

    decaying = tmp_path / "decaying"
    decaying.mkdir()
    (decaying / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "train": {**PARAMS["train"],
                                                                              "lr_schedule": "linear"}}))
    refused = averaging(decaying, "--until", "200", "--last", "1")
    assert refused.returncode != 0 and "train.lr_schedule linear" in refused.stderr
    assert "Traceback" not in refused.stderr + between.stderr + too_few.stderr


def moses_lowercased_bleu(reference: Path, hypothesis: Path) -> float:
    """bench/README.md's command for the Multi30k papers' figure, run with the tools' own CLIs."""
    tools = Path(sys.executable).parent
    tokenized = []
    for path in (reference, hypothesis):
        with path.open(encoding="utf-8") as text, path.with_suffix(".tok").open("w", encoding="utf-8") as tokens:
            subprocess.run([str(tools / "sacremoses"), "-l", "de", "-j", "1", "tokenize", "-x"], stdin=text,
                           stdout=tokens, check=True)
        tokenized.append(str(path.with_suffix(".tok")))
    cli = subprocess.run([str(tools / "sacrebleu"), tokenized[0], "-i", tokenized[1], "-tok", "none", "-lc", "-m",
                          "bleu", "-b", "-w", "2"], capture_output=True, text=True, check=True)
    return float(cli.stdout.strip())


def test_lowercased_tokenized_bleu_is_what_the_sacremoses_and_sacrebleu_commands_compute(tmp_path):
    """On Multi30k's German references and a damaged copy of them (words dropped, case and punctuation changed):
    the bench's figure is the commands' and differs from the cased 13a BLEU the stage reports."""
    from stages.evaluate import score

    bench = bench_module("averaging")
    refs = multi30k_lines("test_2016_flickr", "de", 300)
    hyps = [" ".join(ref.split()[: -1 - i % 3]) + ("." if i % 2 else "") for i, ref in enumerate(refs)]
    hyps = [hyp.lower() if i % 4 == 0 else hyp for i, hyp in enumerate(hyps)]
    (tmp_path / "ref.txt").write_text(lines(refs), encoding="utf-8")
    (tmp_path / "hyp.txt").write_text(lines(hyps), encoding="utf-8")

    figure, signature = bench.lowercased_tokenized_bleu(hyps, refs, "de")
    assert figure == moses_lowercased_bleu(tmp_path / "ref.txt", tmp_path / "hyp.txt")
    assert 10 < figure < 90 and figure != score(hyps, refs)["bleu"]
    assert signature == "nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:2.6.0"


def test_lowercased_tokenized_option_scores_the_runs_translations(run_dir, tmp_path):
    result = averaging(run_dir, "--last", "3", "--split", "test", "--hyp-dir", str(tmp_path), "--lowercased-tokenized")
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    refs = read_pairs_by_direction(Paths(run_dir).split_file(Paths(run_dir).clean, "test"))["en-de"][2]
    (tmp_path / "ref.txt").write_text(lines(refs), encoding="utf-8")
    expected = moses_lowercased_bleu(tmp_path / "ref.txt", tmp_path / "test.en-de.last3.hyp.txt")
    assert figures["last_3"]["bleu_lowercased_tokenized"] == {"en-de": expected}
    assert "lowercased tokenized: en-de" in result.stdout
