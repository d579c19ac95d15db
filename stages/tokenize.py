"""tokenize: train SentencePiece on the cleaned training pairs and encode every split to token arrays.

By default one joint model serves both languages (`tokenize.joint: false` trains one per side). With
`model.init: pretrained` the checkpoint's own tokenizer is used instead of training one. The vocabulary
follows the Opus-MT/Marian layout so the trained model converts to CTranslate2 unchanged: `</s>` = 0,
`<unk>` = 1, the SentencePiece pieces, and `<pad>` appended as the LAST id. The tokenizer is also saved as a
standard transformers `MarianTokenizer` (`hf_tokenizer/`), which the train stage ships inside `models/final`,
so `AutoTokenizer.from_pretrained("models/final")` gives the same ids as the arrays here.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifacts import Paths, atomic_path, splits_in, write_json
from pipeline.corpus import count_rows, iter_pair_batches
from pipeline.errors import MissingArtifact, PipelineError
from pipeline.params import Params
from pipeline.token_arrays import TokenArrayWriter, flatten, token_dtype

log = logging.getLogger("mtpipe.tokenize")

EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
SIDES = ("src", "tgt")


def _threads(setting: int | str) -> int:
    return (os.cpu_count() or 1) if setting == "auto" else int(setting)


def _train_sentences(train_file: Path, columns: tuple[str, ...]) -> Iterator[str]:
    for batch in iter_pair_batches(train_file, ["src", "tgt"]):
        for column in columns:
            yield from (s for s in batch.column(column).to_pylist() if s)


def train_spm(params: Params, train_file: Path, model_file: Path, columns: tuple[str, ...]) -> Path:
    """Train a SentencePiece model on the given sides of the training pairs. Input sampling is seeded."""
    import sentencepiece as spm

    tok = params.tokenize
    spm.set_random_generator_seed(tok.seed)
    # The model comes back through model_writer rather than model_prefix: SentencePiece stores model_prefix in
    # the model's trainer spec, and here that is a random temporary path, so the same inputs would give a
    # different spm.model (and a DVC cache miss downstream) on every run.
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_train_sentences(train_file, columns),
            model_writer=model,
            model_type=tok.model_type,
            vocab_size=tok.vocab_size,
            # Joint: a soft limit, SentencePiece stops at the vocabulary a small corpus supports. Separate: exact,
            # so both sides have the same size and <pad> gets the same (last) id on both.
            hard_vocab_limit=not tok.joint,
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
    except RuntimeError as err:
        raise PipelineError(f"SentencePiece training failed for tokenize.vocab_size={tok.vocab_size}: {err}") from None
    model_file.write_bytes(model.getvalue())
    return model_file


def marian_vocab(spm_model: Path) -> dict[str, int]:
    """The SentencePiece pieces in id order, then <pad> as the last id (Opus-MT/CTranslate2 layout)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    vocab[PAD] = len(vocab)
    return vocab


def write_hf_tokenizer(src_spm: Path, tgt_spm: Path, out_dir: Path, src_lang: str, tgt_lang: str) -> None:
    """Save a transformers MarianTokenizer over the SentencePiece model(s): one shared vocab.json when joint,
    vocab.json + target_vocab.json when the sides have their own models."""
    from transformers import MarianTokenizer

    separate = src_spm != tgt_spm
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        (tmp / "vocab.json").write_text(json.dumps(marian_vocab(src_spm), ensure_ascii=False), encoding="utf-8")
        if separate:
            target_vocab = json.dumps(marian_vocab(tgt_spm), ensure_ascii=False)
            (tmp / "target_vocab.json").write_text(target_vocab, encoding="utf-8")
        tokenizer = MarianTokenizer(
            source_spm=str(src_spm),
            target_spm=str(tgt_spm),
            vocab=str(tmp / "vocab.json"),
            target_vocab_file=str(tmp / "target_vocab.json") if separate else None,
            separate_vocabs=separate,
            source_lang=src_lang,
            target_lang=tgt_lang,
            unk_token=UNK,
            eos_token=EOS,
            pad_token=PAD,
            model_max_length=1024,
        )
        tokenizer.save_pretrained(tmp)


# texts -> (ids of every sentence back to back, each ending in </s>; the length of each sentence)
Encoder = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]


def append_eos(flat: np.ndarray, lengths: np.ndarray, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Insert </s> after every sequence of a flat id array, vectorised (no per-sentence list copies)."""
    ends = np.cumsum(lengths + 1)
    out = np.full(int(ends[-1]) if len(ends) else 0, eos_id, dtype=flat.dtype)
    body = np.ones(len(out), dtype=bool)
    body[ends - 1] = False
    out[body] = flat
    return out, lengths + 1


def spm_encoder(model_file: Path, eos_id: int, threads: int) -> Encoder:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    return lambda texts: append_eos(*flatten(sp.encode(texts, num_threads=threads)), eos_id)


def pretrained_tokenizer(params: Params, out_dir: Path) -> tuple[dict[str, Any], dict[str, Encoder]]:
    """model.init: pretrained: the checkpoint's own tokenizer encodes the corpus and travels with the model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(params.model.name_or_path)
    tokenizer.save_pretrained(out_dir / "hf_tokenizer")
    meta = {"vocab_size": len(tokenizer), "pad_id": tokenizer.pad_token_id, "eos_id": tokenizer.eos_token_id,
            "unk_id": tokenizer.unk_token_id, "tokenizer": params.model.name_or_path}
    encoders: dict[str, Encoder] = {  # the tokenizer appends </s> itself
        "src": lambda texts: flatten(tokenizer(texts).input_ids),
        "tgt": lambda texts: flatten(tokenizer(text_target=texts).input_ids),
    }
    return meta, encoders


def trained_tokenizer(params: Params, train_file: Path, out_dir: Path) -> tuple[dict[str, Any], dict[str, Encoder]]:
    """Train SentencePiece (joint or one model a side) on the training pairs; save the HF tokenizer beside it."""
    threads = os.cpu_count() or 1  # encoding output does not depend on the thread count; training does
    if params.tokenize.joint:
        src_spm = tgt_spm = train_spm(params, train_file, out_dir / "spm.model", ("src", "tgt"))
    else:
        src_spm = train_spm(params, train_file, out_dir / "spm.src.model", ("src",))
        tgt_spm = train_spm(params, train_file, out_dir / "spm.tgt.model", ("tgt",))
    write_hf_tokenizer(src_spm, tgt_spm, out_dir / "hf_tokenizer", params.data.src_lang, params.data.tgt_lang)
    vocab = marian_vocab(src_spm)
    # Separate models are trained to exactly vocab_size pieces, so both sides share the size and the <pad> id.
    meta = {"vocab_size": len(vocab), "pad_id": vocab[PAD], "eos_id": vocab[EOS], "unk_id": vocab[UNK],
            "tokenizer": "sentencepiece", "joint": params.tokenize.joint}
    encoders = {"src": spm_encoder(src_spm, vocab[EOS], threads), "tgt": spm_encoder(tgt_spm, vocab[EOS], threads)}
    return meta, encoders


def _length_stats(lengths: list[np.ndarray]) -> dict[str, float]:
    n = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    if not len(n):
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0}
    return {"mean": round(float(n.mean()), 2), "p50": float(np.percentile(n, 50)),
            "p99": float(np.percentile(n, 99)), "max": int(n.max())}


def encode_split(
    encoders: dict[str, Encoder], parquet: Path, prefix: Path, dtype: str, unk_id: int, max_len: int, drop: bool
) -> dict[str, Any]:
    """Encode one split, streaming over Parquet batches; every sentence ends with </s>.

    Pairs with a side longer than `max_len` tokens are counted; with `drop` they are left out of the arrays.
    """
    from tqdm import tqdm

    writers = {side: TokenArrayWriter(prefix.parent / f"{prefix.name}.{side}", np.dtype(dtype)) for side in SIDES}
    lengths: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}
    unknown = total = overlong = 0
    # disable=None: a bar on a terminal only; a log file (DVC, CI, Prefect) gets none of its redraws.
    progress = tqdm(total=count_rows(parquet), desc=f"encode {parquet.stem}", unit="pairs", unit_scale=True,
                    mininterval=2, disable=None)
    for batch in iter_pair_batches(parquet, ["src", "tgt"]):
        progress.update(len(batch))
        encoded = {side: encoders[side](batch.column(side).to_pylist()) for side in SIDES}
        too_long = (encoded["src"][1] > max_len) | (encoded["tgt"][1] > max_len)
        overlong += int(too_long.sum())
        for side in SIDES:
            flat, n = encoded[side]
            if drop and too_long.any():
                flat, n = flat[np.repeat(~too_long, n)], n[~too_long]
            writers[side].add_flat(flat, n)
            lengths[side].append(n)
            total += int(n.sum())
            unknown += int(np.count_nonzero(flat == unk_id))
    progress.close()
    rows = {side: writers[side].close() for side in SIDES}
    return {
        "pairs": rows["src"],
        "src_tokens": _length_stats(lengths["src"]),
        "tgt_tokens": _length_stats(lengths["tgt"]),
        "unk_rate": round(unknown / max(total, 1), 6),
        f"over_max_len_{'dropped' if drop else 'truncated'}": overlong,
    }


def run(params: Params, paths: Paths) -> dict[str, Any]:
    train_file = paths.split_file(paths.clean, "train")
    if not train_file.exists():
        raise MissingArtifact(train_file, "clean")
    splits = splits_in(paths.clean)
    max_len = params.train.max_len

    with atomic_path(paths.tokenized) as out:
        out.mkdir()
        if params.model.init == "pretrained":
            meta, encoders = pretrained_tokenizer(params, out)
        else:
            meta, encoders = trained_tokenizer(params, train_file, out)
        dtype = token_dtype(meta["vocab_size"])
        meta.update(dtype=dtype, splits=splits, src_lang=params.data.src_lang, tgt_lang=params.data.tgt_lang)
        (out / "meta.json").write_text(json.dumps(meta, indent=2))
        per_split = {
            # Only training pairs are ever dropped; test sets are translated whole (the model truncates input).
            s: encode_split(encoders, paths.split_file(paths.clean, s), out / s, dtype, meta["unk_id"], max_len,
                            drop=params.tokenize.overlong == "drop" and s == "train")
            for s in splits
        }

    metrics = {"vocab_size": meta["vocab_size"], "dtype": dtype, "max_len": max_len, "splits": per_split}
    write_json(paths.metrics("tokenize"), metrics)
    log.info("tokenized %s with a %d-entry vocabulary", {s: v["pairs"] for s, v in per_split.items()},
             meta["vocab_size"])
    return {"vocab_size": meta["vocab_size"], "train_pairs": per_split["train"]["pairs"]}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "tokenize")
