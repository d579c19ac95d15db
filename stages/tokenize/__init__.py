"""tokenize: train SentencePiece on the cleaned training pairs and encode every split to token arrays.

By default one joint model serves every language (`tokenize.joint: false` trains one per side, for one direction
only). With one direction SentencePiece trains on the stream of both sides (sampling `input_sentence_size` of
them itself); with several, on a sample balanced across languages (stages/tokenize/sample.py). With
`model.init: pretrained` the checkpoint's own tokenizer is used instead of training one.

The vocabulary follows the Opus-MT/Marian layout so the trained model converts to CTranslate2 unchanged:
`</s>` = 0, `<unk>` = 1, the SentencePiece pieces, and `<pad>` appended as the LAST id. With more than one target
language the target tags (`>>de<<`) are SentencePiece user-defined symbols (never split; ids 2, 3, ... right after
the control pieces), and every source sequence starts with its row's tag: the text's pieces get the tag id put in
front (the tag is not encoded as text, where SentencePiece would give it a `▁` piece of its own).

The tokenizer is also saved as a standard transformers `MarianTokenizer` (`hf_tokenizer/`), which the train stage
ships inside `models/final`, so `AutoTokenizer.from_pretrained("models/final")(">>de<< " + text)`
(`Directions.tagged`) gives the same ids as the arrays here. Beside each split's arrays, `<split>.dir.npy` gives
every row's direction, an index into languages.json's directions (pipeline/token_arrays.py); meta.json holds the
vocabulary's size and special ids and the arrays' dtype, nothing of the languages.

With `model.init: pretrained` (Marian/OPUS-MT, mBART, mBART-50, M2M-100, NLLB: pipeline/runtime/families.py) every row
is encoded by the checkpoint's own tokenizer set to the row's direction, `tokenizer(src, text_target=tgt)` with
src_lang/tgt_lang set (Marian multi-target: the target's tag in front of the source), so the arrays are what the
checkpoint was trained on. Either way `hf_tokenizer/languages.json`, the model's one record of its languages,
holds the directions, the family, each language's code and each direction's layout of special ids
(pipeline/runtime/model_languages.py), which every later stage reads through ModelLanguages.read: for a
pretrained checkpoint measured on its tokenizer (stages/tokenize/checkpoint_tokenizer.py), for the trained one the
Marian layout it is built with.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifacts import TOKENIZER_DIR, Paths, atomic_path, splits_in, write_json
from pipeline.corpus import count_rows, iter_pair_batches
from pipeline.errors import HubUnreachable, MissingArtifact
from pipeline.params import Params
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.families import Family, checkpoint_codes, family_of
from pipeline.runtime.languages import Directions, target_tag
from pipeline.runtime.model_languages import DirectionLayout, ModelLanguages, family_named
from pipeline.token_arrays import (
    TokenArrayWriter,
    flatten,
    token_dtype,
    write_row_directions,
)
from stages.tokenize.sample import DIRECTION_COLUMNS, balanced_sample, row_directions
from stages.tokenize.subword_sampling import Segmenter, nbest_segmenter

log = logging.getLogger("mtpipe.tokenize")

EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
SIDES = ("src", "tgt")


def _threads(setting: int | str) -> int:
    return (os.cpu_count() or 1) if setting == "auto" else int(setting)


def sentences_of(train_file: Path, columns: tuple[str, ...]) -> Iterator[str]:
    """Every non-empty sentence of the given sides of the training pairs, streamed (the one-direction input)."""
    for batch in iter_pair_batches(train_file, ["src", "tgt"]):
        for column in columns:
            yield from (s for s in batch.column(column).to_pylist() if s)


def train_spm(params: Params, sentences: Iterable[str], model_file: Path, reserved: list[str] | None = None) -> Path:
    """Train a SentencePiece model on `sentences`, with `reserved` pieces (never split) right after the control
    pieces. Input sampling is seeded."""
    import sentencepiece as spm

    tok = params.tokenize
    spm.set_random_generator_seed(tok.seed)
    # The model comes back through model_writer rather than model_prefix: SentencePiece stores model_prefix in
    # the model's trainer spec, and here that is a random temporary path, so the same inputs would give a
    # different spm.model (and a DVC cache miss downstream) on every run.
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
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
            # The target tags, one piece each wherever they stand (none: the same model as without the option).
            user_defined_symbols=list(reserved or ()),
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


def write_hf_tokenizer(src_spm: Path, tgt_spm: Path, out_dir: Path, languages: ModelLanguages) -> None:
    """Save a transformers MarianTokenizer over the SentencePiece model(s): one shared vocab.json when joint,
    vocab.json + target_vocab.json when the sides have their own models; languages.json beside them."""
    from transformers import MarianTokenizer

    separate = src_spm != tgt_spm
    directions = languages.directions
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
            # Only its Moses punctuation normaliser reads these (never on encoding): None where there are several.
            source_lang=_only(directions.sources),
            target_lang=_only(directions.targets),
            unk_token=UNK,
            eos_token=EOS,
            pad_token=PAD,
            model_max_length=1024,
        )
        tokenizer.save_pretrained(tmp)
        languages.write(tmp)


def _only(languages: list[str]) -> str | None:
    return languages[0] if len(languages) == 1 else None


# (texts, each row's index into the directions) -> (ids of every sentence back to back, each ending in </s>; the
# length of each sentence). The direction picks a source sentence's target tag; target encoders ignore it.
Encoder = Callable[[list[str], np.ndarray], tuple[np.ndarray, np.ndarray]]
# (sources, targets, each row's index into the directions) -> {"src": (ids, lengths), "tgt": (ids, lengths)}, as
# an Encoder gives them: what encode_split calls on every batch of pairs.
PairEncoder = Callable[[list[str], list[str], np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]


def frame(flat: np.ndarray, lengths: np.ndarray, eos_id: int,
          first_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every sequence of a flat id array as [first id] + ids + [</s>] (the first id only when given, one per
    sequence), vectorised (no per-sentence list copies)."""
    framed = lengths + (1 if first_ids is None else 2)
    ends = np.cumsum(framed)
    out = np.full(int(ends[-1]) if len(ends) else 0, eos_id, dtype=flat.dtype)
    body = np.ones(len(out), dtype=bool)
    body[ends - 1] = False
    if first_ids is not None:
        starts = ends - framed
        out[starts] = first_ids
        body[starts] = False
    out[body] = flat
    return out, framed


def spm_encoder(model_file: Path, eos_id: int, threads: int, tag_ids: np.ndarray | None = None) -> Encoder:
    """Encode with SentencePiece's one best; with `tag_ids` (one per direction) each sequence starts with its row's
    tag."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    return framed(lambda texts: flatten(sp.encode(texts, num_threads=threads)), eos_id, tag_ids)


def framed(segment: Segmenter, eos_id: int, tag_ids: np.ndarray | None = None) -> Encoder:
    """An Encoder from a Segmenter: each segmentation followed by </s>, after its row's tag when tagged."""
    def encode(texts: list[str], direction_of_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat, lengths = segment(texts)
        return frame(flat, lengths, eos_id, None if tag_ids is None else tag_ids[direction_of_rows])

    return encode


def side_by_side(encoders: dict[str, Encoder]) -> PairEncoder:
    """Pairs encoded one side at a time, each side by its own Encoder (SentencePiece: a side's ids do not depend
    on the other side)."""
    def encode(sources: list[str], targets: list[str],
               direction_of_rows: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {"src": encoders["src"](sources, direction_of_rows), "tgt": encoders["tgt"](targets, direction_of_rows)}

    return encode


def _tag_ids(vocab: dict[str, int], directions: Directions) -> np.ndarray | None:
    """Each direction's target-tag id, or None when targets are not tagged."""
    if not directions.target_tags:
        return None
    return np.array([vocab[target_tag(d.tgt)] for d in directions.directions], dtype=np.int64)


def load_checkpoint(name: str) -> tuple[Any, Any]:
    """(tokenizer, config) of model.name_or_path, a local save_pretrained directory or a hub name; a PipelineError
    saying what to do when it cannot be loaded: HubUnreachable for a hub name not in the local cache while the hub
    cannot be reached (offline, HF_HUB_OFFLINE=1)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(name)
        return AutoTokenizer.from_pretrained(name), config
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__
        if Path(name).is_dir() or not isinstance(err, OSError):
            raise PipelineError(f"model.name_or_path {name}: not a checkpoint with a config.json and tokenizer "
                                f"files that load ({reason})") from None
        raise HubUnreachable(
            f"model.name_or_path {name!r} is not a local directory, and the Hugging Face hub is unreachable from "
            f"here (or has no such model): {reason}. Pass a local directory: set model.name_or_path "
            "to a directory the checkpoint was saved to with save_pretrained (on a machine that reaches the hub)"
        ) from None


def checkpoint_encoder(tokenizer: Any, family: Family, directions: Directions, codes: dict[str, str]) -> PairEncoder:
    """Every row encoded by the checkpoint's tokenizer set to the row's direction: a batch's rows are grouped by
    direction, each group encoded in one call (stages/tokenizer_layout.encode_direction), and the ids put back in
    row order. The tokenizer adds every special id (codes, tags, </s>) itself."""
    from stages.tokenize.checkpoint_tokenizer import encode_direction

    def encode(sources: list[str], targets: list[str],
               direction_of_rows: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        ids: dict[str, list[list[int]]] = {side: [[] for _ in sources] for side in SIDES}
        for number in np.unique(direction_of_rows).tolist():
            rows = np.flatnonzero(direction_of_rows == number).tolist()
            encoded = encode_direction(tokenizer, family, directions.directions[number], codes,
                                       [sources[i] for i in rows], [targets[i] for i in rows])
            for side, side_ids in zip(SIDES, encoded, strict=True):
                for row, row_ids in zip(rows, side_ids, strict=True):
                    ids[side][row] = row_ids
        return {side: flatten(ids[side]) for side in SIDES}

    return encode


def pretrained_tokenizer(params: Params, out_dir: Path, directions: Directions) -> tuple[dict[str, Any], PairEncoder]:
    """model.init: pretrained: the checkpoint's own tokenizer encodes the corpus, each row in its direction, and
    travels with the model; languages.json records the family, the codes and each direction's layout as the
    tokenizer itself lays the special ids out."""
    from stages.tokenize.checkpoint_tokenizer import measure_layout, tokenizer_vocabulary

    name = params.model.name_or_path
    where = f"model.name_or_path {name}"
    tokenizer, config = load_checkpoint(name)
    family = family_of(config.model_type, type(tokenizer).__name__, where)
    vocabulary = tokenizer_vocabulary(tokenizer)
    # The check check_params ran on the checkpoint's files where they were there to read, now on the tokenizer as
    # it loaded (a hub checkpoint's files may only now have arrived), before anything is encoded.
    declared = (getattr(tokenizer, "source_lang", None), getattr(tokenizer, "target_lang", None))
    codes = checkpoint_codes(family, vocabulary, directions, params.model.language_codes, where, declared)
    # Saved before any direction is set, so the checkpoint's own src_lang/tgt_lang defaults travel with it.
    tokenizer.save_pretrained(out_dir / TOKENIZER_DIR)
    layouts = {str(d): measure_layout(tokenizer, family, config, d, codes, where) for d in directions.directions}
    ModelLanguages(directions, family, codes, layouts).write(out_dir / TOKENIZER_DIR)
    meta = {
        # Every id the tokenizer can give fits the arrays' dtype (M2M-100's codes are outside get_vocab()).
        "vocab_size": max(len(tokenizer), max(vocabulary.values()) + 1), "pad_id": tokenizer.pad_token_id,
        "eos_id": tokenizer.eos_token_id, "unk_id": tokenizer.unk_token_id, "tokenizer": name,
    }
    return meta, checkpoint_encoder(tokenizer, family, directions, codes)


def scratch_languages(vocab: dict[str, int], directions: Directions) -> ModelLanguages:
    """The trained tokenizer's languages: the Marian family, the targets' tags as codes when there are several
    targets, and the layout it is built with (the tag in front of the source, </s> after each side, decoding from
    <pad>)."""
    eos, pad = vocab[EOS], vocab[PAD]
    codes = {t: target_tag(t) for t in directions.targets} if directions.target_tags else {}
    layouts = {str(d): DirectionLayout((vocab[codes[d.tgt]],) if codes else (), (eos,), (), (eos,), pad)
               for d in directions.directions}
    return ModelLanguages(directions, family_named("marian"), codes, layouts)


def trained_tokenizer(params: Params, train_file: Path, out_dir: Path,
                      directions: Directions) -> tuple[dict[str, Any], list[PairEncoder], dict[str, Any]]:
    """Train SentencePiece (joint or one model a side) on the training pairs; save the HF tokenizer beside it.
    Returns the meta, the training split's encodings (the one best, then `tokenize.sampled_copies` sampled ones:
    stages/tokenize/subword_sampling.py; every other split takes the first) and the per-language figures of the
    balanced sample (empty with one direction)."""
    threads = os.cpu_count() or 1  # encoding output does not depend on the thread count; training does
    tok = params.tokenize
    sample: dict[str, Any] = {}
    if len(directions.directions) > 1:
        sentences, sample = balanced_sample(train_file, directions, tok.input_sentence_size, tok.temperature,
                                            tok.seed)
        src_spm = tgt_spm = train_spm(params, sentences, out_dir / "spm.model", directions.tags)
    elif tok.joint:
        src_spm = tgt_spm = train_spm(params, sentences_of(train_file, SIDES), out_dir / "spm.model")
    else:
        src_spm = train_spm(params, sentences_of(train_file, ("src",)), out_dir / "spm.src.model")
        tgt_spm = train_spm(params, sentences_of(train_file, ("tgt",)), out_dir / "spm.tgt.model")
    vocab = marian_vocab(src_spm)
    write_hf_tokenizer(src_spm, tgt_spm, out_dir / TOKENIZER_DIR, scratch_languages(vocab, directions))
    # Separate models are trained to exactly vocab_size pieces, so both sides share the size and the <pad> id.
    meta = {"vocab_size": len(vocab), "pad_id": vocab[PAD], "eos_id": vocab[EOS], "unk_id": vocab[UNK],
            "tokenizer": "sentencepiece", "joint": tok.joint}
    eos, tag_ids = vocab[EOS], _tag_ids(vocab, directions)
    encodings = [side_by_side({"src": spm_encoder(src_spm, eos, threads, tag_ids),
                               "tgt": spm_encoder(tgt_spm, eos, threads)})]
    for copy in range(1, tok.sampled_copies + 1):
        src, tgt = (nbest_segmenter(model, tok.sampling_nbest, tok.sampling_alpha, [tok.seed, copy, side])
                    for side, model in enumerate((src_spm, tgt_spm)))
        encodings.append(side_by_side({"src": framed(src, eos, tag_ids), "tgt": framed(tgt, eos)}))
    return meta, encodings, sample


def _length_stats(lengths: list[np.ndarray]) -> dict[str, float]:
    n = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    if not len(n):
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0}
    return {"mean": round(float(n.mean()), 2), "p50": float(np.percentile(n, 50)),
            "p99": float(np.percentile(n, 99)), "max": int(n.max())}


class SplitWriter:
    """One split's token arrays, its rows' directions and its figures, written a batch of encoded pairs at a time.
    Pairs with a side longer than `max_len` tokens are counted; with `drop` they are left out of the arrays."""

    def __init__(self, prefix: Path, dtype: str, unk_id: int, max_len: int, drop: bool):
        self.prefix, self.unk_id, self.max_len, self.drop = prefix, unk_id, max_len, drop
        self.writers = {side: TokenArrayWriter(prefix.parent / f"{prefix.name}.{side}", np.dtype(dtype))
                        for side in SIDES}
        self.lengths: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}
        self.kept_directions: list[np.ndarray] = []
        self.unknown = self.total = self.overlong = 0

    def add(self, encoded: dict[str, tuple[np.ndarray, np.ndarray]], row_dirs: np.ndarray) -> None:
        too_long = (encoded["src"][1] > self.max_len) | (encoded["tgt"][1] > self.max_len)
        self.overlong += int(too_long.sum())
        self.kept_directions.append(row_dirs[~too_long] if self.drop else row_dirs)
        for side in SIDES:
            flat, n = encoded[side]
            if self.drop and too_long.any():
                flat, n = flat[np.repeat(~too_long, n)], n[~too_long]
            self.writers[side].add_flat(flat, n)
            self.lengths[side].append(n)
            self.total += int(n.sum())
            self.unknown += int(np.count_nonzero(flat == self.unk_id))

    def close(self, direction_names: list[str]) -> dict[str, Any]:
        pairs = {side: self.writers[side].close() for side in SIDES}
        row_dirs = np.concatenate(self.kept_directions) if self.kept_directions else np.zeros(0, dtype=np.uint8)
        write_row_directions(self.prefix, row_dirs)
        per_direction = np.bincount(row_dirs, minlength=len(direction_names))
        return {
            "pairs": pairs["src"],
            # The directions this split holds (a test set may hold only some of them).
            "pairs_per_direction": {name: int(n) for name, n in zip(direction_names, per_direction, strict=True) if n},
            "src_tokens": _length_stats(self.lengths["src"]),
            "tgt_tokens": _length_stats(self.lengths["tgt"]),
            "unk_rate": round(self.unknown / max(self.total, 1), 6),
            f"over_max_len_{'dropped' if self.drop else 'truncated'}": self.overlong,
        }


def encode_split(
    encodings: list[PairEncoder], parquet: Path, prefix: Path, dtype: str, unk_id: int, max_len: int, drop: bool,
    directions: Directions,
) -> dict[str, Any]:
    """Encode one split, streaming over Parquet batches, every pair in its row's direction (with the special ids
    the tokenizer adds: </s>, tags, language codes). Writes the token arrays and each row's direction
    (`<split>.dir.npy`); a row of a direction the model does not have is an error. With several `encodings` (the
    training split's sampled copies) the split is written once per encoding, one after the other: row i of the
    first pass is the split's row i.

    Pairs with a side longer than `max_len` tokens are counted; with `drop` they are left out of the arrays.
    """
    from tqdm import tqdm

    out = SplitWriter(prefix, dtype, unk_id, max_len, drop)
    # disable=None: a bar on a terminal only; a log file (DVC, CI, Prefect) gets none of its redraws.
    progress = tqdm(total=count_rows(parquet) * len(encodings), desc=f"encode {parquet.stem}", unit="pairs",
                    unit_scale=True, mininterval=2, disable=None)
    for encode_pairs in encodings:
        rows_read = 0
        for batch in iter_pair_batches(parquet, [*SIDES, *DIRECTION_COLUMNS]):
            progress.update(len(batch))
            row_dirs = row_directions(batch, directions.names, parquet, rows_read)
            rows_read += len(batch)
            out.add(encode_pairs(batch.column("src").to_pylist(), batch.column("tgt").to_pylist(), row_dirs), row_dirs)
    progress.close()
    figures = out.close(directions.names)
    return {**figures, "segmentations_per_pair": len(encodings)} if len(encodings) > 1 else figures


def run(params: Params, paths: Paths) -> dict[str, Any]:
    directions = params.data.directions
    train_file = paths.split_file(paths.clean, "train")
    if not train_file.exists():
        raise MissingArtifact(train_file, "clean")
    splits = splits_in(paths.clean)
    max_len = params.train.max_len

    with atomic_path(paths.tokenized) as out:
        out.mkdir()
        sample: dict[str, Any] = {}
        if params.model.init == "pretrained":
            meta, encode_pairs = pretrained_tokenizer(params, out, directions)
            encodings = [encode_pairs]
        else:
            meta, encodings, sample = trained_tokenizer(params, train_file, out, directions)
        dtype = token_dtype(meta["vocab_size"])
        meta.update(dtype=dtype, splits=splits)
        (out / "meta.json").write_text(json.dumps(meta, indent=2))
        per_split = {
            # Only training pairs are ever dropped or sampled again; test sets are translated whole (the model
            # truncates input) in the one best.
            s: encode_split(encodings if s == "train" else encodings[:1], paths.split_file(paths.clean, s), out / s,
                            dtype, meta["unk_id"], max_len, drop=params.tokenize.overlong == "drop" and s == "train",
                            directions=directions)
            for s in splits
        }

    metrics = {"vocab_size": meta["vocab_size"], "dtype": dtype, "max_len": max_len, "splits": per_split}
    if sample:
        metrics["sentencepiece_sample"] = sample
    write_json(paths.metrics("tokenize"), metrics)
    log.info("tokenized %s with a %d-entry vocabulary", {s: v["pairs"] for s, v in per_split.items()},
             meta["vocab_size"])
    return {"vocab_size": meta["vocab_size"], "train_pairs": per_split["train"]["pairs"]}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "tokenize")
