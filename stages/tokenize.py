"""tokenize: train a joint SentencePiece model on the cleaned training pairs and encode every split to arrays.

The vocabulary follows the Opus-MT/Marian layout so the trained model converts to CTranslate2 unchanged:
`</s>` = 0, `<unk>` = 1, the SentencePiece pieces, and `<pad>` appended as the LAST id. The tokenizer is also
saved as a standard transformers `MarianTokenizer` (`hf_tokenizer/`), which the train stage ships inside
`models/final`, so `AutoTokenizer.from_pretrained("models/final")` gives the same ids as the arrays here.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import iter_pair_batches
from pipeline.errors import MissingArtifact
from pipeline.params import Params
from pipeline.token_arrays import TokenArrayWriter, token_dtype

log = logging.getLogger("mtpipe.tokenize")

EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
SIDES = ("src", "tgt")


def _threads(setting: int | str) -> int:
    return (os.cpu_count() or 1) if setting == "auto" else int(setting)


def _train_sentences(train_file: Path) -> Iterator[str]:
    for batch in iter_pair_batches(train_file, ["src", "tgt"]):
        for column in ("src", "tgt"):
            yield from (s for s in batch.column(column).to_pylist() if s)


def train_spm(params: Params, train_file: Path, out_dir: Path) -> Path:
    """Train the joint SentencePiece model; returns the .model path. Sampling of input sentences is seeded."""
    import sentencepiece as spm

    tok = params.tokenize
    spm.set_random_generator_seed(tok.seed)
    # The model comes back through model_writer rather than model_prefix: SentencePiece stores model_prefix in
    # the model's trainer spec, and here that is a random temporary path, so the same inputs would give a
    # different spm.model (and a DVC cache miss downstream) on every run.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=_train_sentences(train_file),
        model_writer=model,
        model_type=tok.model_type,
        vocab_size=tok.vocab_size,
        # A soft limit: on a small corpus SentencePiece stops at the vocabulary it can support.
        hard_vocab_limit=False,
        character_coverage=tok.character_coverage,
        byte_fallback=tok.byte_fallback,
        input_sentence_size=tok.input_sentence_size,
        shuffle_input_sentence=True,
        num_threads=_threads(tok.threads),
        # Marian layout: eos 0, unk 1, no bos; <pad> is appended after the pieces (see module docstring).
        eos_id=0,
        unk_id=1,
        bos_id=-1,
        pad_id=-1,
        minloglevel=2,
    )
    model_file = out_dir / "spm.model"
    model_file.write_bytes(model.getvalue())
    return model_file


def write_hf_tokenizer(spm_model: Path, out_dir: Path, src_lang: str, tgt_lang: str) -> dict[str, int]:
    """Save a transformers MarianTokenizer over the joint SentencePiece model; returns the vocabulary."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    vocab[PAD] = len(vocab)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        (tmp / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        tokenizer = MarianTokenizer(
            source_spm=str(spm_model),
            target_spm=str(spm_model),
            vocab=str(tmp / "vocab.json"),
            source_lang=src_lang,
            target_lang=tgt_lang,
            unk_token=UNK,
            eos_token=EOS,
            pad_token=PAD,
            model_max_length=1024,
        )
        tokenizer.save_pretrained(tmp)
    return vocab


def encode_split(sp: Any, parquet: Path, prefix: Path, dtype: str, threads: int) -> dict[str, Any]:
    """Encode one split, streaming over Parquet batches; every sentence ends with </s> (id 0)."""
    writers = {side: TokenArrayWriter(prefix.parent / f"{prefix.name}.{side}", np.dtype(dtype)) for side in SIDES}
    lengths: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}
    unknown = total = 0
    unk_id = sp.piece_to_id(UNK)
    for batch in iter_pair_batches(parquet, ["src", "tgt"]):
        for side in SIDES:
            ids = sp.encode(batch.column(side).to_pylist(), num_threads=threads)
            ids = [seq + [0] for seq in ids]
            writers[side].add(ids)
            n = np.fromiter((len(s) for s in ids), dtype=np.int64, count=len(ids))
            lengths[side].append(n)
            total += int(n.sum())
            unknown += sum(seq.count(unk_id) for seq in ids)
    rows = {side: writers[side].close() for side in SIDES}
    stats: dict[str, Any] = {"pairs": rows["src"]}
    for side in SIDES:
        n = np.concatenate(lengths[side]) if lengths[side] else np.zeros(0, dtype=np.int64)
        stats[f"{side}_tokens"] = {
            "mean": round(float(n.mean()), 2) if len(n) else 0.0,
            "p50": float(np.percentile(n, 50)) if len(n) else 0.0,
            "p99": float(np.percentile(n, 99)) if len(n) else 0.0,
            "max": int(n.max()) if len(n) else 0,
        }
    stats["unk_rate"] = round(unknown / max(total, 1), 6)
    return stats


def run(params: Params, paths: Paths) -> dict[str, Any]:
    import sentencepiece as spm

    train_file = paths.split_file(paths.clean, "train")
    if not train_file.exists():
        raise MissingArtifact(train_file, "clean")
    splits = splits_in(paths.clean)
    threads = os.cpu_count() or 1  # encoding output does not depend on the thread count; training does

    with atomic_path(paths.tokenized) as out:
        out.mkdir()
        model_file = train_spm(params, train_file, out)
        vocab = write_hf_tokenizer(model_file, out / "hf_tokenizer", params.data.src_lang, params.data.tgt_lang)
        dtype = token_dtype(len(vocab))
        meta = {
            "vocab_size": len(vocab),
            "pad_id": vocab[PAD],
            "eos_id": vocab[EOS],
            "unk_id": vocab[UNK],
            "dtype": dtype,
            "splits": splits,
            "src_lang": params.data.src_lang,
            "tgt_lang": params.data.tgt_lang,
        }
        (out / "meta.json").write_text(json.dumps(meta, indent=2))
        sp = spm.SentencePieceProcessor(model_file=str(model_file))
        per_split = {s: encode_split(sp, paths.split_file(paths.clean, s), out / s, dtype, threads) for s in splits}

    metrics = {"vocab_size": len(vocab), "dtype": dtype, "splits": per_split}
    write_json(paths.metrics("tokenize"), metrics)
    log.info("tokenized %s with a %d-piece vocabulary", {s: v["pairs"] for s, v in per_split.items()}, len(vocab))
    return {"vocab_size": len(vocab), "train_pairs": per_split["train"]["pairs"]}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "tokenize")
