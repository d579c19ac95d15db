"""Translate with an exported model (`models/export`) on ONNX Runtime: no torch, no transformers.

    from pipeline.translate import Translator
    Translator("models/export").translate(["A dog runs.", "", "Two men talk."], beam=4)
    Translator("models/multi").translate(["A dog runs."], tgt="fr")    # a model of several targets

A model translates the directions of its `languages.json` (pipeline/languages.py; the manifest lists them too).
With one target language `tgt` may be left out; with several it names the target, and each source is read with
that target's tag in front (`>>fr<< A dog runs.`, as the model was trained); `src` is needed only where several
source languages go into that target. An unknown or missing choice is an UnknownDirection listing the model's
targets and directions.

The export directory's format (graph names, cache layout, the manifest `export.json`) is pipeline/export_format.py;
the search is pipeline/beam_search.py; batching, padding and the output length rule are pipeline/decoding.py.
This module runs the graphs (`OnnxSeq2Seq`), tokenizes (`MarianSentencePiece`) and puts them together
(`Translator`).

The encoder also projects its states into every decoder layer's cross-attention keys and values, once per
sentence, and they stay one per sentence (a sentence's beams attend to them together). The decoder takes the
self-attention keys and values of the tokens decoded so far and returns them extended by the new ones, so a
decoding step feeds one token per row and costs O(length), not the whole prefix again; the first step passes an
empty (past_len 0) cache. The decoder also returns each row's best next tokens for the beam it was exported for
(ONNX Runtime's TopK is much faster than numpy over the vocabulary); searching asks for those and the caches only,
so the full logits are neither copied out nor sorted.

Decoding defaults (beam, length penalty, length rule) are the manifest's `generation` block: the evaluate stage's
settings, so a translation here is the one the evaluate stage scored.

Tokenization is the transformers MarianTokenizer's, reimplemented over the SentencePiece models and vocab.json of
the export directory (transformers is a 1-2 s import and this path must start fast).

Imports numpy and, when a model is loaded, onnxruntime and sentencepiece.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from pipeline.beam_search import Cache, DecoderStep, beam_search
from pipeline.decoding import one_line, output_limit, pad_batch, token_batches
from pipeline.errors import InputFileError
from pipeline.export_format import (
    DECODER_FIRST_INPUTS,
    DECODER_FIRST_OUTPUTS,
    ENCODER_INPUTS,
    MANIFEST,
    ExportDirError,
    ExportManifest,
    cache_names,
    decoder_inputs,
    read_export_json,
)
from pipeline.languages import Direction, Directions

log = logging.getLogger("mtpipe.translate")

SPIECE_UNDERLINE = "\u2581"
DEFAULT_THREADS = 2
# Rows x longest source per encoder call, beams included: bounds the memory of the caches and the logits.
DEFAULT_MAX_TOKENS = 6000


# --------------------------------------------------------------------------------------------------- tokenizer


class MarianSentencePiece:
    """MarianTokenizer's ids and text without transformers: SentencePiece pieces mapped through vocab.json.

    encode: pieces of the source model (a leading `>>xx<<` language code kept as one token), each looked up in
    vocab.json (unknown -> <unk>), then </s>. decode: ids -> pieces (special tokens dropped, as with
    `skip_special_tokens=True`), pieces -> text with the SentencePiece model MarianTokenizer decodes with (the
    source one, unless the vocabularies are separate).
    """

    def __init__(self, model_dir: Path):
        import sentencepiece as spm

        tokenizer_config = read_export_json(model_dir / "tokenizer_config.json")
        self.vocab: dict[str, int] = read_export_json(model_dir / "vocab.json")
        self.pieces = {i: piece for piece, i in self.vocab.items()}
        self.source = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
        self.target = spm.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
        # MarianTokenizer decodes with the source model unless the vocabularies are separate.
        self.decoder_spm = self.target if tokenizer_config.get("separate_vocabs") else self.source
        self.eos_token = _token_text(tokenizer_config.get("eos_token", "</s>"))
        self.unk_token = _token_text(tokenizer_config.get("unk_token", "<unk>"))
        self.pad_token = _token_text(tokenizer_config.get("pad_token", "<pad>"))
        self.eos_id, self.unk_id, self.pad_id = (
            self.vocab[t] for t in (self.eos_token, self.unk_token, self.pad_token)
        )
        self.special_ids = {self.eos_id, self.unk_id, self.pad_id}
        self.special_ids.update(int(i) for i in tokenizer_config.get("added_tokens_decoder", {}))

    def encode(self, text: str) -> list[int]:
        """Ids of a sentence, ending with </s> (untruncated)."""
        code: list[str] = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        pieces = code + self.source.encode(text, out_type=str)
        return [self.vocab.get(p, self.unk_id) for p in pieces] + [self.eos_id]

    def decode(self, ids: Iterable[int]) -> str:
        pieces = []
        for i in ids:
            if i in self.special_ids:
                continue
            piece = self.pieces.get(i)
            if piece is None:  # ids outside vocab.json fall back to the SentencePiece model, as in MarianTokenizer
                piece = self.decoder_spm.id_to_piece(i) if 0 <= i < self.decoder_spm.get_piece_size() else ""
                piece = piece or self.unk_token
            pieces.append(piece)
        return self.decoder_spm.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()


def _token_text(token: Any) -> str:
    # tokenizer_config.json stores special tokens either as strings or as AddedToken dicts.
    return token["content"] if isinstance(token, dict) else str(token)


# --------------------------------------------------------------------------------------------------- runtime


# Graph rewrites ONNX Runtime would apply that make these graphs slower on CPUs: its fused SkipLayerNormalization
# kernel is slower than the Add + LayerNormalization it replaces here, in int8 and fp32 (bench/README.md).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def ort_session(path: Path, threads: int = DEFAULT_THREADS) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=DISABLED_OPTIMIZERS)


class OnnxSeq2Seq:
    """The encoder and KV-cached decoder sessions, called with numpy arrays."""

    def __init__(self, encoder_path: Path, decoder_path: Path, threads: int = DEFAULT_THREADS):
        self.encoder = ort_session(encoder_path, threads)
        self.decoder = ort_session(decoder_path, threads)
        inputs = self.decoder.get_inputs()
        self.layers = sum(i.name.startswith("self_key_") for i in inputs)
        names = [i.name for i in inputs]
        if not self.layers or names != decoder_inputs(self.layers):
            raise ExportDirError(
                f"{decoder_path} has inputs {names}, not a KV-cached decoder's: export it again with this version "
                "(`dvc repro export`)"
            )
        # (heads, head_dim) of the caches, from the graph's static dims.
        _, heads, _, head_dim = inputs[len(DECODER_FIRST_INPUTS)].shape
        self.heads, self.head_dim = int(heads), int(head_dim)
        self.self_cache_names = cache_names("self", self.layers)
        self.cross_cache_names = cache_names("cross", self.layers)
        # What a search step reads: the outputs after `logits`.
        self.search_outputs = [*DECODER_FIRST_OUTPUTS[1:], *cache_names("present_self", self.layers)]
        # Next-token candidates per row the graph returns (a static dim).
        self.candidates = int(self.decoder.get_outputs()[DECODER_FIRST_OUTPUTS.index("next_ids")].shape[1])

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Cache]:
        """(last_hidden_state, cross cache)."""
        hidden, *cross = self.encoder.run(None, dict(zip(ENCODER_INPUTS, (input_ids, attention_mask), strict=True)))
        return hidden, cross

    def empty_cache(self, rows: int) -> Cache:
        return [np.zeros((rows, self.heads, 0, self.head_dim), dtype=np.float32) for _ in self.self_cache_names]

    def decode(
        self,
        decoder_input_ids: np.ndarray,
        encoder_attention_mask: np.ndarray,
        self_cache: Cache,
        cross_cache: Cache,
        logits: bool = True,
        cache_rows: np.ndarray | None = None,
    ) -> DecoderStep:
        """One decoder pass. cache_rows: the self_cache row each row continues from (default: row i from row i).
        logits=False skips copying out the (rows, new_len, vocab) logits: the search needs only the next-token
        candidates and the cache."""
        if cache_rows is None:
            cache_rows = np.arange(len(decoder_input_ids), dtype=np.int64)
        first = (decoder_input_ids, encoder_attention_mask, cache_rows)
        feeds = {**dict(zip(DECODER_FIRST_INPUTS, first, strict=True)),
                 **dict(zip(self.self_cache_names, self_cache, strict=True)),
                 **dict(zip(self.cross_cache_names, cross_cache, strict=True))}
        if logits:
            all_logits, next_log_probs, next_ids, *present = self.decoder.run(None, feeds)
            return DecoderStep(all_logits, present, next_log_probs, next_ids)
        next_log_probs, next_ids, *present = self.decoder.run(self.search_outputs, feeds)
        return DecoderStep(None, present, next_log_probs, next_ids)


# --------------------------------------------------------------------------------------------------- translator


class Translator:
    """Translate lines with an export directory; line i of the output is the translation of line i of the input.

    Empty (or blank) lines give empty lines. A line longer than the model's positions (or `max_input_tokens`) is
    truncated to its first tokens, with a warning naming the line.

    `threads` batches are decoded at once, each on one ONNX Runtime thread, as CTranslate2's `inter_threads`: on a
    model this small most graph ops take microseconds, and splitting each of them over threads costs more in
    synchronisation than it saves (bench/decode.py measures both). The sessions are shared: ONNX Runtime runs
    concurrent calls, and the numpy search between them is short.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        int8: bool = False,
        threads: int = DEFAULT_THREADS,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_input_tokens: int | None = None,
    ):
        self.model_dir = Path(model_dir)
        self.manifest = ExportManifest.read(self.model_dir)
        if not self.manifest.kv_cache:
            raise ExportDirError(
                f"{self.model_dir} holds an export without a KV-cached ONNX decoder: export it again "
                "(`dvc repro export`)"
            )
        files = self.manifest.onnx_graphs(int8)
        if not files:
            what = "int8 ONNX graphs (export.int8: true)" if int8 else "ONNX graphs (export.onnx: true)"
            raise ExportDirError(f"{self.model_dir} has no {what}")
        for name in files.values():
            if not (self.model_dir / name).is_file():
                raise ExportDirError(f"{self.model_dir / name} not found (listed in {MANIFEST})")
        self.directions = _export_directions(self.model_dir, self.manifest)
        self.tokenizer = MarianSentencePiece(self.model_dir)
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.model = OnnxSeq2Seq(self.model_dir / files["encoder"], self.model_dir / files["decoder"], threads=1)
        self.ids = self.manifest.special_ids
        self.max_positions = self.manifest.dims.max_positions
        self.max_input_tokens = min(max_input_tokens or self.max_positions, self.max_positions)
        self.max_tokens = max_tokens
        self.generation = self.manifest.generation

    def max_new_tokens(self, source_length: int) -> int:
        """Most tokens a translation of a source this long (</s> included) may have: the manifest's length rule."""
        return output_limit(source_length, self.generation.max_len_a, self.generation.max_len_b, self.max_positions)

    def direction(self, tgt: str | None = None, src: str | None = None) -> Direction:
        """The direction asked for (either language may be left out where the model leaves no choice);
        UnknownDirection listing the model's targets and directions otherwise."""
        return self.directions.find(src, tgt)

    def source_ids(self, line: str, direction: Direction) -> list[int]:
        """A line's ids as the model reads them for `direction` (its target's tag first when targets are tagged),
        </s> included, untruncated."""
        return self.tokenizer.encode(self.directions.tagged(line, direction.tgt))

    def encode(self, lines: Sequence[str], direction: Direction | None = None,
               first_line: int = 1) -> list[list[int] | None]:
        """Ids per line for `direction` (default: the model's only one), None for a blank line, truncated to
        max_input_tokens with a warning (a tag stays: the first tokens are kept)."""
        direction = direction or self.direction()
        encoded: list[list[int] | None] = []
        for number, line in enumerate(lines, start=first_line):
            if not line.strip():
                encoded.append(None)
                continue
            ids = self.source_ids(line, direction)
            if len(ids) > self.max_input_tokens:
                log.warning(
                    "line %d: %d source tokens, more than the %d the model takes; translating its first %d",
                    number, len(ids), self.max_input_tokens, self.max_input_tokens,
                )
                ids = ids[: self.max_input_tokens - 1] + [self.tokenizer.eos_id]
            encoded.append(ids)
        return encoded

    def translate_ids(self, sources: Sequence[Sequence[int]], beam: int = 4,
                      length_penalty: float | None = None) -> list[list[int]]:
        """Hypothesis ids (with </s>) per source, in input order, batched by tokens; `threads` batches at once."""
        penalty = self.generation.length_penalty if length_penalty is None else length_penalty
        budget = max(self.max_tokens // beam, 1)
        if self.threads > 1:  # small inputs too are split so that every thread has a batch
            budget = min(budget, max(sum(len(s) for s in sources) // self.threads, 1))
        batches = token_batches([len(s) for s in sources], budget)
        # The longest-running batches start first, so the last ones to start are short and threads finish together.
        batches.sort(key=lambda batch: len(batch) * len(sources[batch[-1]]), reverse=True)

        def search(batch: list[int]) -> list[list[int]]:
            rows = [sources[i] for i in batch]
            input_ids, attention_mask = pad_batch(rows, self.ids.pad)
            limits = [self.max_new_tokens(len(r)) for r in rows]
            return beam_search(self.model, input_ids, attention_mask, beam=beam, max_new_tokens=limits,
                               ids=self.ids, length_penalty=penalty)

        out: list[list[int]] = [[] for _ in sources]
        if self.threads == 1 or len(batches) == 1:
            results = map(search, batches)
        else:
            with ThreadPoolExecutor(self.threads) as pool:
                results = list(pool.map(search, batches))
        for batch, hyps in zip(batches, results, strict=True):
            for i, hyp in zip(batch, hyps, strict=True):
                out[i] = hyp
        return out

    def translate(self, lines: Sequence[str], beam: int = 4, length_penalty: float | None = None, *,
                  tgt: str | None = None, src: str | None = None) -> list[str]:
        """The translation of each line into `tgt` (from `src`): see the module docstring for when they may be
        left out."""
        if beam < 1:
            raise ValueError(f"beam must be at least 1, got {beam}")
        encoded = self.encode(lines, self.direction(tgt, src))
        present = [i for i, ids in enumerate(encoded) if ids is not None]
        hyps = self.translate_ids([encoded[i] for i in present], beam=beam, length_penalty=length_penalty)
        out = [""] * len(lines)
        for i, hyp in zip(present, hyps, strict=True):
            # A byte-fallback piece can decode to a line break; the output must stay one line per input line.
            out[i] = one_line(self.tokenizer.decode(hyp))
        return out


def _export_directions(model_dir: Path, manifest: ExportManifest) -> Directions:
    """The export's directions (its languages.json), which must be the ones its manifest lists."""
    try:
        directions = Directions.read(model_dir)
    except ValueError as err:
        raise ExportDirError(f"{err}: export it again (`dvc repro export`)") from None
    if directions.names != list(manifest.directions):
        raise ExportDirError(f"{model_dir}: languages.json lists {', '.join(directions.names)} but {MANIFEST} "
                             f"{', '.join(manifest.directions)}: export it again (`dvc repro export`)")
    return directions


def read_lines(stream: BinaryIO, name: str = "<stdin>") -> list[str]:
    """Lines of a UTF-8 byte stream without their line ends; invalid UTF-8 is an error naming the line."""
    lines = []
    for number, raw in enumerate(stream, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            bad = raw[err.start : err.start + 1].hex()
            raise InputFileError(
                name, f"not valid UTF-8 (byte 0x{bad} at byte {err.start + 1} of the line); convert the input to "
                "UTF-8 first, e.g. `iconv -f latin1 -t utf-8`", line=number
            ) from None
        lines.append(text.rstrip("\r\n"))
    return lines
