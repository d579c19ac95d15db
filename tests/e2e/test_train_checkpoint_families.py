"""train with a pretrained checkpoint of every family: the decoder inputs are the labels shifted as the family's own
model shifts them (Marian from <pad>, mBART cc25 with its wrap-around, mBART-50, M2M-100 and NLLB from </s>), one
start per row's direction; truncation keeps what the family's tokenizer keeps; train-time BLEU decodes each
direction after its decoder prefix; a tiny mBART-50 learns; `train.freeze` keeps the frozen weights as they were;
`train.gradient_checkpointing` trains exactly as without it; and a checkpoint outside the families, or of another
family than the data was tokenized for, stops before training."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.artifacts import Paths
from pipeline.params import parse
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.model_languages import DirectionLayout, ModelLanguages
from pipeline.token_arrays import TokenArray, TokenArrayWriter
from stages import tokenize, train
from stages.train.batching import IGNORE_INDEX, Collator
from stages.train.data import load_data
from tests.conftest import write_interleaved_splits

pytestmark = pytest.mark.e2e

TWO = ("en-de", "en-fr")
SIZES = {"train": 160, "valid": 24, "test": 8}
# The single-target tiny Marian translates en-de only; the others take both directions.
DIRECTIONS = {"marian": ("en-de",), "marian-multi": TWO, "mbart": TWO, "mbart50": TWO, "m2m100": TWO, "nllb": TWO}
# One thread: these tiny matrices gain nothing from more, and the machine's cores are shared.
FAST = {"threads": 1, "valid_bleu_sentences": 0, "max_tokens": 600, "log_every": 5, "valid_every": 10,
        "save_every": 10, "warmup_steps": 5, "lr": 3e-3}


def params_for(checkpoint: Path, directions: tuple[str, ...], **train_settings) -> object:
    """Params of a `files` corpus of `directions` (tokenize and train read data/ only; the patterns are never
    opened) fine-tuning `checkpoint`."""
    files = {split: {"pattern": f"corpus/{split}.{{lang}}"} for split in SIZES}
    return parse({"data": {"source": "files", "directions": list(directions), "files": files},
                  "model": {"init": "pretrained", "name_or_path": str(checkpoint)},
                  "train": {"max_steps": 20, **FAST, **train_settings}})


def interleaved_corpus(root: Path, directions: tuple[str, ...]) -> Path:
    """data/clean of `directions` (Multi30k) with the rows of every split shuffled (seeded), so that a batch holds
    rows of every direction in no order."""
    write_interleaved_splits(root, SIZES, directions)
    return root


@pytest.fixture(scope="module")
def tokenized_with(tiny_checkpoint, tmp_path_factory):
    """A factory: `tokenized_with("mbart50")` -> (checkpoint, project root holding data/clean and data/tokenized,
    tokenized by the tokenize stage with that checkpoint's tokenizer); built once per family. Read-only: copy its
    data/ (`project`) to train in it."""
    built: dict[str, tuple[Path, Path]] = {}

    def tokenized(family: str) -> tuple[Path, Path]:
        if family not in built:
            checkpoint = tiny_checkpoint(family)
            root = interleaved_corpus(tmp_path_factory.mktemp(f"tokenized_{family}"), DIRECTIONS[family])
            tokenize.run(params_for(checkpoint, DIRECTIONS[family]), Paths(root))
            built[family] = checkpoint, root
        return built[family]

    return tokenized


def project(tokenized_root: Path, root: Path) -> Paths:
    shutil.copytree(tokenized_root / "data", root / "data")
    return Paths(root)


def run_data(paths_or_root, max_len: int = 256):
    from types import SimpleNamespace

    root = paths_or_root.root if isinstance(paths_or_root, Paths) else paths_or_root
    return load_data(root / "data" / "tokenized",
                     SimpleNamespace(max_len=max_len, max_tokens=600, seed=1, temperature=1.5,
                                     direction_weights={}))


def curve(paths: Paths, name: str) -> dict[int, float]:
    """A DVCLive curve as {step: value}."""
    with open(paths.dvclive / "plots" / "metrics" / f"{name}.tsv", encoding="utf-8") as f:
        return {int(row["step"]): float(row[name.split("/")[-1]]) for row in csv.DictReader(f, delimiter="\t")}


def family_shift(model, labels):
    """The decoder inputs the family's own model builds from `labels` (a torch batch, -100 on padding)."""
    from transformers.models.m2m_100.modeling_m2m_100 import shift_tokens_right as m2m100_shift
    from transformers.models.marian.modeling_marian import shift_tokens_right as marian_shift
    from transformers.models.mbart.modeling_mbart import shift_tokens_right as mbart_shift

    config = model.config
    if config.model_type == "mbart":
        return mbart_shift(labels, config.pad_token_id)
    shift = {"marian": marian_shift, "m2m_100": m2m100_shift}[config.model_type]
    return shift(labels, config.pad_token_id, config.decoder_start_token_id)


def rows_of(root: Path, split: str) -> list[dict]:
    return pq.read_table(root / "data" / "clean" / f"{split}.parquet").to_pylist()


@pytest.mark.parametrize("family", list(DIRECTIONS))
def test_decoder_inputs_are_the_labels_shifted_as_the_family_s_model_shifts_them(family, tokenized_with):
    """Every valid row in one batch (rows of both directions mixed): per row, the family's shift_tokens_right of
    its labels (the tokenizer's, as tokenize wrote them) is the Collator's decoder input, padded with <pad>; and
    the model's loss from the labels alone (it shifts them itself) is the loss from the Collator's inputs."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    checkpoint, root = tokenized_with(family)
    data = run_data(root)
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint).eval()
    rows = np.arange(len(data.valid.src))
    batch = data.valid(rows)
    assert len(set(data.valid.row_directions.tolist())) == len(DIRECTIONS[family])
    pad = model.config.pad_token_id
    for row in rows:
        labels = data.valid.tgt[row].astype(np.int64)
        n = len(labels)
        assert batch.labels[row, :n].tolist() == labels.tolist()
        expected = family_shift(model, torch.from_numpy(labels)[None, :])[0].tolist()
        assert batch.decoder_input_ids[row, :n].tolist() == expected, f"row {row}"
        assert (batch.decoder_input_ids[row, n:] == pad).all()
    starts = batch.decoder_input_ids[:, 0]
    if family == "mbart":  # the wrap-around: each row starts from its own target code
        codes = {layout.target_suffix[-1] for layout in data.languages.layouts.values()}
        assert set(starts.tolist()) == codes and len(codes) == 2
    else:
        assert set(starts.tolist()) == {model.config.decoder_start_token_id}

    inputs = {k: torch.from_numpy(v) for k, v in batch.arrays().items() if k != "target_positions"}
    with torch.no_grad():
        own = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                    labels=inputs["labels"]).loss
        ours = model(**inputs).loss
    assert torch.equal(own, ours)


@pytest.mark.parametrize("family", list(DIRECTIONS))
def test_truncation_keeps_what_the_family_s_tokenizer_keeps(family, tokenized_with):
    """A short max_len cuts every row as the tokenizer's own truncation does (`truncation=True`): its framing
    (the codes, </s>; mBART cc25's two trailing ids) stays, the text's pieces are cut."""
    from transformers import AutoTokenizer

    checkpoint, root = tokenized_with(family)
    max_len = 6
    data = run_data(root, max_len=max_len)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    languages = data.languages
    batch = data.valid(np.arange(len(data.valid.src)))
    for row, pair in enumerate(rows_of(root, "valid")):
        direction = f"{pair['src_lang']}-{pair['tgt_lang']}"
        src = pair["src"]
        if family.startswith("marian"):
            src = f"{languages.codes[pair['tgt_lang']]} {src}" if languages.codes else src
        else:
            told = {code: code.strip("_") if family == "m2m100" else code for code in languages.codes.values()}
            tokenizer.src_lang = told[languages.codes[pair["src_lang"]]]
            tokenizer.tgt_lang = told[languages.codes[pair["tgt_lang"]]]
        encoded = tokenizer(src, text_target=pair["tgt"], truncation=True, max_length=max_len)
        n_src, n_tgt = len(encoded["input_ids"]), len(encoded["labels"])
        assert batch.input_ids[row, :n_src].tolist() == encoded["input_ids"], (row, direction)
        assert batch.labels[row, :n_tgt].tolist() == encoded["labels"], (row, direction)
        assert batch.decoder_input_ids[row, 0] == languages.layout(direction).decoder_start


def write_arrays(directory: Path, name: str, rows: list[list[int]]) -> TokenArray:
    writer = TokenArrayWriter(directory / name, np.dtype("uint16"))
    writer.add(rows)
    writer.close()
    return TokenArray.open(directory / name)


def test_the_whole_batch_collator_matches_the_row_by_row_rule_with_a_start_and_tail_per_direction(tmp_path):
    """Three directions whose layouts differ (start id, 0, 1 or 2 trailing special ids): the vectorised Collator
    against the rule spelled out row by row, truncation included."""
    (tmp_path / "meta.json").write_text('{"dtype": "uint16"}')
    layouts = [DirectionLayout((), (), (), (), 90), DirectionLayout((91,), (0,), (), (0,), 99),
               DirectionLayout((), (0, 92), (), (0, 93), 93)]
    rng = np.random.default_rng(7)
    directions = rng.integers(0, 3, 300)
    src_rows, tgt_rows = [], []
    for d in directions:
        layout = layouts[d]
        src_rows.append(layout.source(rng.integers(1, 80, rng.integers(1, 20)).tolist()))
        tgt_rows.append([*layout.target_prefix, *rng.integers(1, 80, rng.integers(1, 20)).tolist(),
                         *layout.target_suffix])
    src, tgt = write_arrays(tmp_path, "s", src_rows), write_arrays(tmp_path, "t", tgt_rows)

    def clip(ids, tail, max_len):
        return ids if len(ids) <= max_len else ids[: max_len - tail] + (ids[len(ids) - tail :] if tail else [])

    for max_len in (5, 12, 64):
        collate = Collator(src, tgt, 99, max_len, directions, layouts)
        for indices in [rng.choice(300, size=n, replace=False) for n in (1, 9, 60)]:
            batch = collate(indices)
            for row, i in enumerate(indices):
                layout = layouts[directions[i]]
                s = clip(src_rows[i], len(layout.source_suffix), max_len)
                t = clip(tgt_rows[i], len(layout.target_suffix), max_len)
                assert batch.input_ids[row].tolist() == s + [99] * (batch.input_ids.shape[1] - len(s))
                assert batch.labels[row].tolist() == t + [IGNORE_INDEX] * (batch.labels.shape[1] - len(t))
                shifted = [layout.decoder_start, *t[:-1]]
                assert batch.decoder_input_ids[row].tolist() == shifted + [99] * (batch.labels.shape[1] - len(t))


def test_train_time_bleu_decodes_each_direction_after_its_decoder_prefix(tokenized_with):
    """Each sampled source is generated from its own direction's prefix (</s> de_DE or </s> fr_XX, in one batch),
    and the hypothesis is what follows it; the references are the targets without their code."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from stages.train.bleu import ValidBleu

    checkpoint, root = tokenized_with("mbart50")
    data = run_data(root)
    tokenized = root / "data" / "tokenized"
    tokenizer = AutoTokenizer.from_pretrained(tokenized / "hf_tokenizer")
    bleu = ValidBleu(data.valid, data.valid_rows, tokenized / "hf_tokenizer", 5, seed=1, max_tokens=4000,
                     max_len_a=1.0, max_len_b=4)
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    prefixes = {name: data.languages.layout(name).decoder_prefix for name in TWO}
    assert prefixes["en-de"] == (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("de_DE"))
    word = tokenizer("Haus", add_special_tokens=False).input_ids
    seen = []

    def generate(input_ids, attention_mask, decoder_input_ids, **settings):
        seen.append(decoder_input_ids.tolist())
        # A fixed translation after whatever prefix came in: the prefix, a word, </s>.
        tail = torch.tensor([[*word, tokenizer.eos_token_id]] * len(input_ids))
        return torch.cat([decoder_input_ids, tail], dim=1)

    model.generate = generate
    hyps = bleu.translate(model, torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False))
    given = [p for batch in seen for p in batch]
    assert len(seen) == 1 and len(given) == 10  # both directions' sentences decoded together
    assert sorted(map(tuple, given)) == sorted([prefixes["en-de"]] * 5 + [prefixes["en-fr"]] * 5)
    assert hyps == [tokenizer.decode(word)] * 10
    assert bleu.refs[:5] == [tokenizer.decode(data.valid.tgt[i][1:-1]) for i in bleu_rows(data, 5)[:5]]
    assert not any("de_DE" in r or "fr_XX" in r for r in bleu.refs)


def bleu_rows(data, sentences: int) -> list[int]:
    """The valid rows ValidBleu samples (its seeded draw, direction after direction)."""
    rng = np.random.default_rng(1)
    return [int(i) for r in data.valid_rows for i in r[rng.choice(len(r), size=min(sentences, len(r)),
                                                                  replace=False)]]


def test_a_few_updates_on_a_tiny_mbart50_lower_the_loss_and_save_a_standard_model(tokenized_with, tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    checkpoint, root = tokenized_with("mbart50")
    paths = project(root, tmp_path)
    metrics = train.run(params_for(checkpoint, TWO, max_steps=30, valid_bleu_sentences=4), paths)
    losses, valid = curve(paths, "train/loss"), curve(paths, "valid/loss")
    assert losses[30] < losses[5] - 1.0 and valid[30] < valid[10]
    assert "bleu" in json.loads((paths.dvclive / "metrics.json").read_text())["valid"]["en-fr"]
    assert metrics["steps"] == 30 and metrics["trained_parameters"] == metrics["parameters"]
    assert AutoModelForSeq2SeqLM.from_pretrained(paths.final_model).config.model_type == "mbart"


@pytest.mark.parametrize("family", list(DIRECTIONS))
def test_every_family_fine_tunes_with_its_train_time_bleu(family, tokenized_with, tmp_path):
    import math

    checkpoint, root = tokenized_with(family)
    paths = project(root, tmp_path)
    metrics = train.run(params_for(checkpoint, DIRECTIONS[family], max_steps=4, valid_every=4, log_every=2,
                                   valid_bleu_sentences=3), paths)
    assert metrics["steps"] == 4 and math.isfinite(metrics["final_valid_loss"])
    assert metrics["best_valid_bleu"] is not None  # decoded every direction from its prefix, and scored
    assert (paths.final_model / "languages.json").exists()


def state(model_dir: Path) -> dict:
    """The saved weights by name (tied names share one tensor)."""
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(model_dir).state_dict()


@pytest.mark.parametrize("part", ["embeddings", "encoder"])
def test_frozen_weights_stay_as_the_checkpoint_has_them_and_the_rest_trains(part, tokenized_with, tmp_path, caplog):
    """embeddings: the shared token embeddings (so the tied output projection) and mBART's learned positions;
    encoder: every encoder weight, which with shared embeddings includes the decoder's token embeddings."""
    import logging

    checkpoint, root = tokenized_with("mbart50")
    paths = project(root, tmp_path)
    with caplog.at_level(logging.INFO, logger="mtpipe.train"):
        metrics = train.run(params_for(checkpoint, TWO, max_steps=10, freeze=[part]), paths)
    before, after = state(checkpoint), state(paths.final_model)
    tokens = ("model.shared.", "model.encoder.embed_tokens.", "model.decoder.embed_tokens.", "lm_head.")
    positions = ("model.encoder.embed_positions.", "model.decoder.embed_positions.")
    frozen = {k for k in before if k.startswith(tokens + positions if part == "embeddings"
                                                else ("model.encoder.", *tokens))}
    changed = {k for k in before if not np.array_equal(before[k].numpy(), after[k].numpy())}
    assert not frozen & changed
    assert changed >= {k for k in before if k.startswith("model.decoder.layers.")}
    if part == "embeddings":
        assert {k for k in changed if k.startswith("model.encoder.layers.")}  # the layers above them still learn
    else:
        assert {k for k in changed if k.startswith("model.decoder.embed_positions.")}
    distinct = {before[k].data_ptr(): before[k].numel() for k in frozen}  # a tied matrix counts once
    assert metrics["parameters"] - metrics["trained_parameters"] == sum(distinct.values())
    assert f"frozen: {part}" in caplog.text


def test_gradient_checkpointing_trains_exactly_as_without_it(tokenized_with, tmp_path, caplog):
    """The tiny checkpoints have dropout 0: the same losses and weights, recomputed activations or not."""
    import logging

    checkpoint, root = tokenized_with("mbart50")
    runs = {}
    for on in (False, True):
        paths = project(root, tmp_path / str(on))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="mtpipe.train"):
            train.run(params_for(checkpoint, TWO, max_steps=10, gradient_checkpointing=on), paths)
        assert ("gradient checkpointing" in caplog.text) == on
        runs[on] = curve(paths, "train/loss"), curve(paths, "valid/loss"), state(paths.final_model)
    assert runs[True][0] == runs[False][0] and runs[True][1] == runs[False][1]
    assert all(np.array_equal(runs[True][2][k].numpy(), runs[False][2][k].numpy()) for k in runs[False][2])


def scratch_model(dropout: float):
    from stages.train.model import build_model

    arch = {"d_model": 32, "ffn_dim": 64, "encoder_layers": 2, "decoder_layers": 2, "attention_heads": 2,
            "dropout": dropout}
    return build_model(parse({"model": {"preset": "tiny", **arch}}).model, 60, 59, 0, seed=3)


def gradients(model, recompute: bool = False, parts: tuple[str, ...] = ()):
    """(loss, {name: gradient}, how often the first encoder layer's attention ran) of one training forward and
    backward under the CPU dropout, seeded."""
    import torch

    from stages.train.dropout import CpuDropout
    from stages.train.model import enable_gradient_checkpointing, freeze

    freeze(model, parts)
    if recompute:
        enable_gradient_checkpointing(model, CpuDropout)
    model.train()
    runs = []
    model.get_encoder().layers[0].self_attn.register_forward_pre_hook(lambda *_: runs.append(1))
    rng = torch.Generator().manual_seed(0)
    x, y = torch.randint(1, 58, (4, 9), generator=rng), torch.randint(1, 58, (4, 7), generator=rng)
    torch.manual_seed(11)
    with CpuDropout():
        loss = model(input_ids=x, decoder_input_ids=y, labels=y, use_cache=False).loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, len(runs)


def test_gradient_checkpointing_recomputes_the_forward_s_cpu_dropout_masks():
    """With dropout on, the recomputation inside backward draws the forward's masks (the CPU dropout is a function
    mode, which backward does not run in unless the checkpoint opens it): the same loss and gradients bit for
    bit. Frozen embeddings do not cut the layers above them off (non-reentrant checkpointing)."""
    import torch

    loss, grads, runs = gradients(scratch_model(0.3))
    loss_re, grads_re, runs_re = gradients(scratch_model(0.3), recompute=True)
    assert (runs, runs_re) == (1, 2)  # the layer ran again inside backward
    assert loss_re == loss and grads_re.keys() == grads.keys()
    assert all(torch.equal(grads_re[n], grads[n]) for n in grads)

    _, frozen, _ = gradients(scratch_model(0.3), recompute=True, parts=("embeddings",))
    assert "model.shared.weight" not in frozen
    assert {n for n in frozen if n.startswith("model.encoder.layers.0.")}


def broken_copy(tiny_checkpoint, tmp_path: Path, family: str, file: str, **changes) -> Path:
    """A copy of a tiny checkpoint with fields of one of its JSON files changed (None removes a field)."""
    directory = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint(family), directory)
    data = json.loads((directory / file).read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (directory / file).write_text(json.dumps(data))
    return directory


def pretrained_spec(checkpoint: Path) -> dict:
    from stages.train.model import model_spec

    return model_spec(parse({"model": {"init": "pretrained", "name_or_path": str(checkpoint)}}).model)


def test_a_checkpoint_whose_tokenizer_config_names_no_class_trains_as_the_family_tokenize_recorded(
        tiny_checkpoint, tokenized_with, tmp_path):
    """Older OPUS-MT repositories' tokenizer_config.json has no tokenizer_class: the tokenize stage worked the
    family out from the tokenizer it loaded and recorded it; training takes the record's word for it."""
    from stages.train.model import build_model

    _, root = tokenized_with("marian")
    languages = ModelLanguages.read(root / "data/tokenized/hf_tokenizer")
    checkpoint = broken_copy(tiny_checkpoint, tmp_path, "marian", "tokenizer_config.json", tokenizer_class=None)
    model = build_model(pretrained_spec(checkpoint), 60, 59, 0, family=languages.family)
    assert languages.family.name == "marian" and model.config.model_type == "marian"


def test_data_tokenized_for_another_family_stops_training_before_it_starts(tokenized_with, tiny_checkpoint, tmp_path):
    _, root = tokenized_with("nllb")
    paths = project(root, tmp_path)
    with pytest.raises(PipelineError, match=r"is a mbart model, but data/tokenized was tokenized for a nllb "
                                            r"checkpoint \(model_type m2m_100"):
        train.run(params_for(tiny_checkpoint("mbart50"), TWO), paths)
    assert not paths.final_model.exists()


def test_a_languages_file_without_layouts_stops_training_naming_it(tokenized_with, tmp_path):
    _, root = tokenized_with("mbart50")
    paths = project(root, tmp_path)
    languages = paths.tokenized / "hf_tokenizer" / "languages.json"
    recorded = json.loads(languages.read_text())
    languages.write_text(json.dumps({"directions": recorded["directions"], "target_tags": False}))
    with pytest.raises(PipelineError, match=r"hf_tokenizer/languages.json: not a languages record with every "
                                            r"direction.s layout"):
        run_data(paths)
