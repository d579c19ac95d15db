"""A published-style mBART-50 checkpoint fine-tuned through the real DAG on two directions of a Multi30k slice, then
translated with `mtpipe translate` on ONNX Runtime alone.

The checkpoint is a tiny random one (tests/support/tiny_checkpoints.py: the real MBart50Tokenizer and
MBartForConditionalGeneration classes, saved with save_pretrained), so nothing here says the model translates
well; what it pins is that every stage treats the checkpoint as its family does. mBART-50 marks the source with
its language code (`en_XX X </s>`) and the translation with the target's code forced after `</s>`. Multi30k is a
multi-way corpus: the English of en-de and en-fr is the same sentences, so both directions' sources are the same
ids and only the forced target code can make their translations differ. Hence the checks that every hypothesis is
what transformers itself generates with that code forced (`forced_bos_token_id`, not the pipeline's prefix code),
and that `mtpipe translate --tgt` gives the evaluate stage's translation of each direction.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import (
    STUDENT_STAGES,
    TEACHER_STAGES,
    dvc,
    git,
    multi30k_per_language,
    project_copy,
    set_params,
    teacher_and_student_stages,
)
from tests.support.fine_tuned import redrawn
from tests.support.tiny_checkpoints import build_tiny

pytestmark = pytest.mark.e2e
# split: (Multi30k file, lines written); train is capped below that by data.max_train_pairs, per direction.
SPLITS = {"train": ("train", 400), "valid": ("val", 24), "test": ("test_2016_flickr", 12)}
TRAIN_PAIRS = 300
DIRECTIONS = ["en-de", "en-fr"]
CODES = {"en": "en_XX", "de": "de_DE", "fr": "fr_XX"}
HAS_CTRANSLATE2 = importlib.util.find_spec("ctranslate2") is not None


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The tiny mBART-50 checkpoint with its weights redrawn (seeded): as built, an untrained tied-embedding model
    repeats the last token it was fed, the target's code, so every translation would decode to an empty line."""
    from transformers import AutoModelForSeq2SeqLM

    directory = build_tiny("mbart50", tmp_path_factory.mktemp("mbart50") / "checkpoint")
    model = AutoModelForSeq2SeqLM.from_pretrained(directory)
    redrawn(model)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def project(tmp_path_factory, checkpoint) -> Path:
    corpus = tmp_path_factory.mktemp("multi30k")
    files = multi30k_per_language(corpus, SPLITS, ("en", "de", "fr"))
    root = project_copy(tmp_path_factory.mktemp("project"))
    set_params(
        root,
        {
            "data": {
                "source": "files",
                "directions": DIRECTIONS,
                "files": files,
                "max_train_pairs": TRAIN_PAIRS,
            },
            "validate": {"language_sample": 200},
            "model": {"init": "pretrained", "name_or_path": str(checkpoint)},
            # A small lr: 20 updates at a larger one collapse the model onto one frequent piece for every source
            # and target, and the translations could no longer tell whether the right code was forced.
            "train": {"max_steps": 20, "max_minutes": 3, "lr": 1e-4, "warmup_steps": 5, "max_tokens": 1024,
                      "log_every": 5, "valid_every": 20, "save_every": 20, "valid_bleu_sentences": 4},
            # Greedy: the hypotheses can be checked against transformers' own greedy search, token by token. Short
            # outputs: an untrained model writes up to the length limit, and every runtime decodes them.
            "evaluate": {"beam": 1, "max_tokens": 1000, "max_len_a": 0.5, "max_len_b": 5},
            # A random model's logits lie close together, so a near-tie may flip a greedy output or two between
            # runtimes; the logit difference stays gated as tightly as ever.
            "export": {"parity_sentences": 8, "int8": False, "torchscript": False, "ctranslate2": HAS_CTRANSLATE2,
                       "ctranslate2_quantization": "float32", "min_identical": 0.75, "max_bleu_delta": 5.0},
        },
    )
    git(root, "commit", "-qam", "mbart50 checkpoint, en-de and en-fr from a Multi30k slice")
    result = dvc(root, "repro")
    assert teacher_and_student_stages(result) == (TEACHER_STAGES, STUDENT_STAGES)
    return root


def read(project: Path, path: str):
    return json.loads((project / path).read_text(encoding="utf-8"))


def read_params(project: Path) -> dict:
    import yaml

    return yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))


def hypotheses(project: Path, direction: str) -> list[str]:
    return (project / f"reports/eval/test.{direction}.hyp.txt").read_text(encoding="utf-8").splitlines()


def test_both_directions_are_trained_and_scored(project):
    assert read(project, "data/raw/manifest.json")["rows_per_direction"]["train"] == dict.fromkeys(
        DIRECTIONS, TRAIN_PAIRS)
    scores = read(project, "metrics/eval.json")
    assert set(scores["test"]) == set(DIRECTIONS)
    for direction in DIRECTIONS:
        assert scores["test"][direction]["sentences"] == SPLITS["test"][1]
        assert len(hypotheses(project, direction)) == SPLITS["test"][1]
    assert read(project, "metrics/train.json")["steps"] == 20


def test_every_stage_after_tokenize_keeps_the_checkpoints_language_layout(project, checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    code_id = {lang: tokenizer.convert_tokens_to_ids(code) for lang, code in CODES.items()}
    eos = tokenizer.eos_token_id
    for directory in ("models/final", "models/export"):
        languages = read(project, f"{directory}/languages.json")
        assert languages["family"] == "mbart50" and languages["codes"] == CODES
        for direction in DIRECTIONS:
            src, tgt = direction.split("-")
            layout = languages["layouts"][direction]
            assert layout["source_prefix"] == [code_id[src]] and layout["source_suffix"] == [eos], directory
            # Decoding starts from </s>, the target's code forced next.
            assert [layout["decoder_start"], *layout["target_prefix"]] == [eos, code_id[tgt]], directory
    manifest = read(project, "models/export/export.json")
    assert languages["directions"] == DIRECTIONS  # the export's own languages.json, which its manifest does not copy
    assert not {"family", "directions"} & set(manifest)
    assert ("ctranslate2" in manifest["files"]) == HAS_CTRANSLATE2


def test_every_tokenized_row_is_the_tokenizers_own_ids_for_its_languages(project, checkpoint):
    import numpy as np
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    meta = read(project, "data/tokenized/meta.json")
    recorded = read(project, "data/tokenized/hf_tokenizer/languages.json")
    rows = pq.read_table(project / "data/clean/test.parquet").to_pylist()
    directions = np.load(project / "data/tokenized/test.dir.npy")
    sides = {}
    for side in ("src", "tgt"):
        offsets = np.load(project / f"data/tokenized/test.{side}.idx.npy")
        tokens = np.fromfile(project / f"data/tokenized/test.{side}.bin", dtype=meta["dtype"])
        sides[side] = [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    assert len(rows) == len(sides["src"]) == len(directions) == len(DIRECTIONS) * SPLITS["test"][1]
    for i, row in enumerate(rows):
        assert recorded["directions"][directions[i]] == f"{row['src_lang']}-{row['tgt_lang']}"
        tokenizer.src_lang, tokenizer.tgt_lang = CODES[row["src_lang"]], CODES[row["tgt_lang"]]
        expected = tokenizer(row["src"], text_target=row["tgt"])
        assert sides["src"][i] == expected["input_ids"], row
        assert sides["tgt"][i] == expected["labels"], row


def evaluated_sources(project: Path, direction: str) -> list[str]:
    """The (cleaned) sources the evaluate stage translated, in the hypothesis file's order."""
    import csv

    with (project / f"reports/eval/test.{direction}.sentences.tsv").open(encoding="utf-8", newline="") as f:
        rows = sorted(csv.DictReader(f, delimiter="\t"), key=lambda row: int(row["line"]))
    return [row["src"] for row in rows]


def _forced_greedy(model, tokenizer, sources: list[str], target_code: str, max_new_tokens: int) -> list[str]:
    """transformers' own greedy translations of `sources` with `target_code` forced after </s>, decoded."""
    import torch

    batch = tokenizer(sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, forced_bos_token_id=tokenizer.convert_tokens_to_ids(target_code),
                             num_beams=1, do_sample=False, max_new_tokens=max_new_tokens,
                             suppress_tokens=[tokenizer.pad_token_id])  # as the stage bans <pad>, but faster
    return [" ".join(text.splitlines()) for text in tokenizer.batch_decode(out, skip_special_tokens=True)]


def test_every_hypothesis_is_decoded_after_its_directions_forced_target_code(project):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(project / "models/final").eval()
    tokenizer = AutoTokenizer.from_pretrained(project / "models/final", src_lang="en_XX")
    evaluate = read_params(project)["evaluate"]
    other = {"de": "fr", "fr": "de"}
    told_apart = 0
    for direction in DIRECTIONS:
        tgt = direction.split("-")[1]
        sources, hyps = evaluated_sources(project, direction), hypotheses(project, direction)
        assert len(sources) == len(hyps) == SPLITS["test"][1]
        assert any(hyps), "every translation is empty: nothing to compare"
        # One more token than the evaluate stage's longest limit (the forced code is one of the new tokens), within
        # the positions: what evaluate wrote must be the start of what transformers writes.
        longest = max(len(ids) for ids in tokenizer(sources)["input_ids"])
        limit = min(int(evaluate["max_len_a"] * longest + evaluate["max_len_b"]) + 1,
                    model.config.max_position_embeddings - 1)
        forced = _forced_greedy(model, tokenizer, sources, CODES[tgt], limit)
        for source, hyp, expected in zip(sources, hyps, forced, strict=True):
            assert expected.startswith(hyp), (direction, source, hyp, expected)
        wrong = _forced_greedy(model, tokenizer, sources, CODES[other[tgt]], limit)
        told_apart += sum(not text.startswith(hyp) for hyp, text in zip(hyps, wrong, strict=True))
    # The check can fail: with the other target's code forced, transformers writes something else.
    assert told_apart > 0


def _translate(project: Path, lines: list[str], no_torch: Path, *args: str) -> subprocess.CompletedProcess:
    """`mtpipe translate` in a process where importing torch fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(no_torch), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [str(Path(sys.executable).parent / "mtpipe"), "translate", "--model", str(project / "models/export"), *args],
        input="\n".join(lines) + "\n", capture_output=True, text=True, env=env, timeout=300,
    )


@pytest.fixture(scope="module")
def no_torch(tmp_path_factory) -> Path:
    """A directory whose `torch` package refuses to import (put first on PYTHONPATH)."""
    root = tmp_path_factory.mktemp("no_torch")
    (root / "torch").mkdir()
    (root / "torch" / "__init__.py").write_text('raise ImportError("mtpipe translate imported torch")\n')
    return root


@pytest.mark.parametrize("tgt", ["fr", "de"])
def test_translate_without_torch_gives_the_evaluate_stages_translation_of_each_direction(project, no_torch, tgt):
    sources = evaluated_sources(project, f"en-{tgt}")[:5]
    greedy = _translate(project, sources, no_torch, "--tgt", tgt)  # the export's beam: evaluate.beam, 1
    assert greedy.returncode == 0, greedy.stderr
    assert greedy.stdout.splitlines() == hypotheses(project, f"en-{tgt}")[:5]
    beam = _translate(project, sources, no_torch, "--tgt", tgt, "--beam", "3")
    assert beam.returncode == 0, beam.stderr
    assert len(beam.stdout.splitlines()) == len(sources)


def test_translate_without_a_target_names_the_choices(project, no_torch):
    result = _translate(project, evaluated_sources(project, "en-de")[:2], no_torch)
    assert result.returncode != 0 and "de, fr" in result.stderr


def test_the_card_describes_the_checkpoint_and_its_snippet_translates_with_the_codes(project, checkpoint):
    readme = (project / "models/release/README.md").read_text(encoding="utf-8")
    assert "`MBartForConditionalGeneration` fine-tuned from the local checkpoint `checkpoint`" in readme
    assert str(checkpoint.parent) not in readme  # named, not where it lay
    assert "mbart50 (model_type mbart): d_model 32, 2+2 layers, 4 heads, FFN 64" in readme
    assert "language codes: en en_XX, de de_DE, fr fr_XX" in readme and "preset `" not in readme
    assert "tags:\n- translation\n- mbart\n" in readme
    snippet = re.search(r"```python\n(.*?)```", readme, re.DOTALL).group(1)
    assert 'src_lang="en_XX"' in snippet and 'forced_bos_token_id=tokenizer.convert_tokens_to_ids("de_DE")' in snippet
    # The tiny checkpoint has 128 positions, fewer than the snippet's 256 new tokens.
    snippet = snippet.replace("max_new_tokens=256", "max_new_tokens=32")
    check = 'print(tokenizer.convert_ids_to_tokens(out[0][:2].tolist()))'
    out = subprocess.run([sys.executable, "-c", f"{snippet}\n{check}"], cwd=project, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr
    decoded, started = out.stdout.splitlines()
    assert decoded.startswith("['") and started == "['</s>', 'de_DE']"
