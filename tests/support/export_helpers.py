"""Helpers of the export and translate tests (their shared fixtures are in tests/e2e/conftest.py and tests/conftest.py).

The tiny model is untrained, so its logits are nearly flat and argmaxes can be decided by 1e-5; the copy used here
has its (tied) embeddings scaled up so every argmax is decisive and the comparisons test the runtimes, not float
noise. The <pad> row stays zero (scaling keeps it so), as training keeps it.

The two-target model (en-de and en-fr in one) is built here the way the tokenize and train stages lay one out:
a joint SentencePiece model whose `>>de<<` and `>>fr<<` tags are user-defined pieces (never split), the Marian
vocabulary (</s> 0, <unk> 1, <pad> last), a MarianTokenizer and languages.json beside an untrained tiny model.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.artifacts import Paths
from pipeline.params import Params, parse
from pipeline.runtime.languages import Directions

# Scales the untrained model's logits from std ~0.16 to ~1.6: top-2 margins go from ~1e-5 to ~0.5.
EMBEDDING_SCALE = 10.0
PARITY_SENTENCES = 32
CTRANSLATE2_INSTALLED = importlib.util.find_spec("ctranslate2") is not None
# Every format the stage has, CTranslate2 where it is installed; thresholds are the defaults.
FULL_EXPORT = {"int8": True, "torchscript": True, "ctranslate2": CTRANSLATE2_INSTALLED}


TWO_TARGETS = ("en-de", "en-fr")
# Sources of every length the translate tests decode, one of a single word.
SENTENCES = [
    "A man in a blue shirt is standing on a ladder.",
    "Two dogs.",
    "A little girl climbs into a wooden playhouse while her brother watches from the grass.",
    "People sit outside.",
    "A woman with a large purse is walking by a gate.",
    "Hello",
]


def sharpened_root(tiny_model_dir: Path, root: Path) -> Paths:
    """A project root with the fixture's cleaned splits and a sharpened copy of its model as models/final."""
    import torch
    from transformers import MarianMTModel

    paths = Paths(root)
    shutil.copytree(tiny_model_dir.parent.parent / "data" / "clean", paths.clean)
    shutil.copytree(tiny_model_dir, paths.final_model)
    model = MarianMTModel.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMBEDDING_SCALE)
    model.save_pretrained(paths.final_model)
    return paths


def export_params(**export_overrides) -> Params:
    return parse({"export": {"parity_sentences": PARITY_SENTENCES, **export_overrides}})


def load_model(model_dir: Path):
    from transformers import AutoTokenizer, MarianMTModel

    return MarianMTModel.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """PyTorch on one thread, restored afterwards.

    When other processes keep the cores busy, torch's OpenMP threads spin against them and a tiny model's
    `generate` can take tens of times longer with two threads than with one. These tests check results, which do not
    depend on the thread count.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def two_target_tokenizer(train_lines: list[str], out: Path, directions: Directions) -> Path:
    """A MarianTokenizer over a joint SentencePiece model with the directions' target tags as user-defined pieces,
    in the Marian layout (</s> 0, <unk> 1, <pad> last), saved with languages.json (the tokenize stage's layouts of a
    scratch model) into `out`."""
    import io
    import json

    import sentencepiece as spm
    from transformers import MarianTokenizer

    from stages.tokenize import scratch_languages

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(train_lines), model_writer=model, model_type="unigram",
                                   vocab_size=600, hard_vocab_limit=False, user_defined_symbols=directions.tags,
                                   eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, minloglevel=2)
    out.mkdir(parents=True)
    spm_file = out / "spm.model"
    spm_file.write_bytes(model.getvalue())
    processor = spm.SentencePieceProcessor(model_file=str(spm_file))
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(source_spm=str(spm_file), target_spm=str(spm_file), vocab=str(out / "vocab.json"),
                                unk_token="<unk>", eos_token="</s>", pad_token="<pad>", model_max_length=1024)
    tokenizer.save_pretrained(out)
    spm_file.unlink()  # saved as source.spm and target.spm
    scratch_languages(vocab, directions).write(out)
    return out


def two_target_model_dir(root: Path) -> Path:
    """`root` as a project after train: data/clean with en-de and en-fr pairs (Multi30k), and models/final, an
    untrained tiny model over a two-target tokenizer; returns models/final."""
    import json

    from stages.train.model import build_model
    from stages.train.save import save_final
    from tests.conftest import multi30k_lines, write_clean_splits

    directions = Directions.of(TWO_TARGETS)
    write_clean_splits(root, {"train": 10, "valid": 10, "test": PARITY_SENTENCES}, TWO_TARGETS)
    train_lines = [line for lang in directions.languages for line in multi30k_lines("train", lang, 1500)]
    tokenizer_dir = two_target_tokenizer(train_lines, root / "data" / "tokenized" / "hf_tokenizer", directions)
    vocab = json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8"))
    model = build_model(parse({"model": {"preset": "tiny"}}).model, len(vocab), vocab["<pad>"], vocab["</s>"])
    paths = Paths(root)
    save_final(model, tokenizer_dir, paths.final_model)
    return paths.final_model
