"""Translate with an exported model (`models/export`) on ONNX Runtime: no torch, no transformers.

    from pipeline.translate import Translator
    Translator("models/export").translate(["A dog runs.", "", "Two men talk."], beam=4)

The export stage writes two graphs (names recorded in `export.json`; caches are one tensor per decoder layer and
kind, shaped (rows, heads, length, head_dim); `batch` counts sentences, `rows` hypotheses: sentences x beams, the
beams of sentence s at rows s * beam ... s * beam + beam - 1):

    encoder.onnx  input_ids, attention_mask (batch, src_len) int64
                  -> last_hidden_state (batch, src_len, d_model), cross_key_0, cross_value_0, ... (batch rows)
    decoder.onnx  decoder_input_ids (rows, new_len), encoder_attention_mask (batch, src_len),
                  cache_rows (rows): the row of the given self cache each row continues from,
                  self_key_0, self_value_0, ... (past_rows, past_len long), cross_key_0, cross_value_0, ... (batch rows)
                  -> logits (rows, new_len, vocab),
                     next_log_probs, next_ids (rows, candidates): the best next tokens after the last position,
                        best first, with their log-softmax (<pad> may be among them: the search drops it),
                     present_self_key_0, present_self_value_0, ... (rows, past_len + new_len long)

The encoder also projects its states into every decoder layer's cross-attention keys and values, once per
sentence, and they stay one per sentence (a sentence's beams attend to them together). The decoder takes the
self-attention keys and values of the tokens decoded so far and returns them extended by the new ones, so a
decoding step feeds one token per row and costs O(length), not the whole prefix again; the first step passes an
empty (past_len 0) cache. The search never copies a cache: it passes the previous step's `present_*` back as they
came out, with `cache_rows` saying which row each hypothesis continues from (beams reordered, finished sentences
dropped), and the graph gathers them on the way in. Beam search only needs each row's 2 x beam + 1 best next tokens (see
candidates_for_beam), which the graph returns for the beam it was exported for (ONNX Runtime's TopK is much faster
than numpy over the vocabulary); searching asks for those and the caches only, so the full logits are neither
copied out nor sorted. A wider beam takes its candidates from the logits, with the same result.

Search follows transformers' `generate` for Marian, so ONNX and PyTorch decode the same way: decoding starts from
<pad>, <pad> is never emitted, </s> is forced at the length limit (scored log p = 0, as transformers' forced-EOS
processor does), and beam search keeps the 2 x beam best continuations, finishes a hypothesis when one of the
`beam` best ends in </s>, scores finished hypotheses by sum(log p) / length ** length_penalty (length counting </s>)
and stops a sentence once it has `beam` finished hypotheses (`early_stopping=True`). The length limit
(max_len_a * source_length + max_len_b) is per sentence, so a translation does not depend on which other sentences
share its batch (the evaluate stage applies the same per-sentence limit to `generate`).

Tokenization is the transformers MarianTokenizer's, reimplemented over the SentencePiece models and vocab.json of
the export directory (transformers is a 1-2 s import and this path must start fast).

Imports numpy and, when a model is loaded, onnxruntime and sentencepiece.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from pipeline.errors import InputFileError, PipelineError

log = logging.getLogger("mtpipe.translate")

MANIFEST = "export.json"
ENCODER_INPUTS = ("input_ids", "attention_mask")
DECODER_FIRST_INPUTS = ("decoder_input_ids", "encoder_attention_mask", "cache_rows")
DECODER_FIRST_OUTPUTS = ("logits", "next_log_probs", "next_ids")
ONNX_FILES = {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
ONNX_INT8_FILES = {"encoder": "encoder.int8.onnx", "decoder": "decoder.int8.onnx"}
SPIECE_UNDERLINE = "\u2581"
DEFAULT_THREADS = 2
# Rows x longest source per encoder call, beams included: bounds the memory of the caches and the logits.
DEFAULT_MAX_TOKENS = 6000

# A cache is a list of per-layer arrays in graph order: [key_0, value_0, key_1, value_1, ...].
Cache = list[np.ndarray]


def candidates_for_beam(beam: int) -> int:
    """Next tokens per row a beam search of this width needs: its sentence keeps the 2 x beam best continuations,
    none of which can lie outside its row's 2 x beam best, and <pad> may take one place."""
    return 2 * beam + 1


def cache_names(prefix: str, layers: int) -> list[str]:
    """[f"{prefix}_key_0", f"{prefix}_value_0", ...]: the graphs' cache inputs/outputs of one kind."""
    return [f"{prefix}_{part}_{layer}" for layer in range(layers) for part in ("key", "value")]


def encoder_outputs(layers: int) -> list[str]:
    return ["last_hidden_state", *cache_names("cross", layers)]


def decoder_inputs(layers: int) -> list[str]:
    return [*DECODER_FIRST_INPUTS, *cache_names("self", layers), *cache_names("cross", layers)]


def decoder_outputs(layers: int) -> list[str]:
    return [*DECODER_FIRST_OUTPUTS, *cache_names("present_self", layers)]


class ExportDirError(PipelineError):
    """The directory is not a complete ONNX export with a KV-cached decoder."""


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

        config = _read_json(model_dir / "tokenizer_config.json")
        self.vocab: dict[str, int] = _read_json(model_dir / "vocab.json")
        self.pieces = {i: piece for piece, i in self.vocab.items()}
        self.source = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
        self.target = spm.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
        # MarianTokenizer decodes with the source model unless the vocabularies are separate.
        self.decoder_spm = self.target if config.get("separate_vocabs") else self.source
        self.eos_token = _token_text(config.get("eos_token", "</s>"))
        self.unk_token = _token_text(config.get("unk_token", "<unk>"))
        self.pad_token = _token_text(config.get("pad_token", "<pad>"))
        self.eos_id, self.unk_id, self.pad_id = (
            self.vocab[t] for t in (self.eos_token, self.unk_token, self.pad_token)
        )
        self.special_ids = {self.eos_id, self.unk_id, self.pad_id}
        self.special_ids.update(int(i) for i in config.get("added_tokens_decoder", {}))

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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportDirError(f"{path} not found: is {path.parent} an export directory (`dvc repro export`)?") from None
    except json.JSONDecodeError as err:
        raise ExportDirError(f"{path}: not valid JSON ({err})") from None


# --------------------------------------------------------------------------------------------------- runtime


# Graph rewrites ONNX Runtime would apply that make these graphs slower on CPUs: its fused SkipLayerNormalization
# kernel is slower than the Add + LayerNormalization it replaces here (a decoder step with 400 rows: int8 30.3 ->
# 25.8 ms, fp32 57.7 -> 54.0 ms, one thread).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def ort_session(path: Path, threads: int = DEFAULT_THREADS) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=DISABLED_OPTIMIZERS)


@dataclass(frozen=True)
class SpecialIds:
    start: int
    eos: int
    pad: int


@dataclass(frozen=True)
class DecoderStep:
    """The decoder's outputs. `logits` is None unless asked for; a runtime without next-token candidates (None)
    leaves the search to pick them from the logits."""

    logits: np.ndarray | None
    self_cache: Cache
    next_log_probs: np.ndarray | None = None
    next_ids: np.ndarray | None = None


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
        self.search_outputs = ["next_log_probs", "next_ids", *cache_names("present_self", self.layers)]
        # Next-token candidates per row the graph returns (a static dim).
        self.candidates = int(self.decoder.get_outputs()[DECODER_FIRST_OUTPUTS.index("next_ids")].shape[1])

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Cache]:
        """(last_hidden_state, cross cache)."""
        hidden, *cross = self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
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
        feeds = {"decoder_input_ids": decoder_input_ids, "encoder_attention_mask": encoder_attention_mask,
                 "cache_rows": cache_rows,
                 **dict(zip(self.self_cache_names, self_cache, strict=True)),
                 **dict(zip(self.cross_cache_names, cross_cache, strict=True))}
        if logits:
            all_logits, next_log_probs, next_ids, *present = self.decoder.run(None, feeds)
            return DecoderStep(all_logits, present, next_log_probs, next_ids)
        next_log_probs, next_ids, *present = self.decoder.run(self.search_outputs, feeds)
        return DecoderStep(None, present, next_log_probs, next_ids)


# --------------------------------------------------------------------------------------------------- search


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _next_token_candidates(out: DecoderStep, count: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """At least `count` next tokens per row that hold the row's `count` best (log-probs, ids), as new arrays;
    <pad> has log-prob -inf.

    From the decoder's own top-k when it has one more than `count` (<pad> may take a place: see
    candidates_for_beam); otherwise from the logits: log-softmax over the whole vocabulary, then <pad> removed, as
    transformers does. Same result, slower.
    """
    if out.next_ids is not None and out.next_ids.shape[1] >= count + 1:
        log_probs = out.next_log_probs[:, : count + 1].astype(np.float32)
        token_ids = out.next_ids[:, : count + 1].astype(np.int64)
        log_probs[token_ids == pad_id] = -np.inf
        return log_probs, token_ids
    if out.logits is None:
        raise ValueError(f"the decoder returned fewer than {count + 1} candidates and no logits")
    log_probs = _log_softmax(out.logits[:, -1, :].astype(np.float32))
    log_probs[:, pad_id] = -np.inf
    top = np.argpartition(-log_probs, count - 1, axis=1)[:, :count]
    return np.take_along_axis(log_probs, top, axis=1), top


def beam_search(
    model: OnnxSeq2Seq,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    *,
    beam: int,
    max_new_tokens: Sequence[int] | np.ndarray,
    ids: SpecialIds,
    length_penalty: float = 1.0,
) -> list[list[int]]:
    """Each sentence's best hypothesis (ids up to and including </s>), batch x beam rows decoded together.

    `max_new_tokens` is per sentence; at that step only </s> is allowed. beam=1 is greedy decoding.
    Sentences leave the batch as soon as they are finished, so a long sentence does not keep short ones' rows busy.
    """
    batch = input_ids.shape[0]
    # The cross cache and mask have a row per sentence; the self cache a row per hypothesis, sentence * beam + b.
    # Reordering beams moves them within their sentence, so only the self cache is ever reordered: by the decoder,
    # which reads row cache_rows[r] of the cache it is given for hypothesis r.
    _, cross_cache = model.encode(input_ids, attention_mask)
    encoder_mask = attention_mask
    # The first step decodes one row per sentence: its beams would all start alike. (transformers decodes `beam`
    # copies and scores all but the first -1e9, which never lets them win: the same search.) `live` is the
    # number of hypotheses per sentence, 1 for the first step and `beam` after it.
    self_cache = model.empty_cache(batch)
    cache_rows = np.arange(batch, dtype=np.int64)

    sentence = np.arange(batch)  # which input sentence each active slot holds
    limit = np.asarray(max_new_tokens, dtype=np.int64).reshape(batch)
    scores = np.zeros((batch, 1), dtype=np.float32)
    tokens = np.zeros((batch, 1, 0), dtype=np.int64)
    last = np.full(batch, ids.start, dtype=np.int64)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    best: list[list[int]] = [[] for _ in range(batch)]
    keep_candidates = 2 * beam  # enough that `beam` continuations survive even if `beam` of them end in </s>
    # The logits are copied out only when the graph's own candidates are too few for this beam.
    needs_logits = getattr(model, "candidates", 0) < candidates_for_beam(beam)

    step = 0
    while sentence.size:
        active, live = scores.shape
        out = model.decode(last[:, None], encoder_mask, self_cache, cross_cache, logits=needs_logits,
                           cache_rows=cache_rows)
        log_probs, token_ids = _next_token_candidates(out, keep_candidates, ids.pad)
        forced = step + 1 >= limit  # this step produces the sentence's last allowed token: only </s>
        if forced.any():
            # As transformers' ForcedEOSTokenLogitsProcessor: </s> gets log-probability 0, everything else -inf.
            rows = np.repeat(forced, live)
            log_probs[rows] = -np.inf
            log_probs[rows, 0] = 0.0
            token_ids[rows, 0] = ids.eos

        # Each sentence's best `keep_candidates` (beam, token) continuations by accumulated log-probability.
        width = log_probs.shape[1]
        total = (scores[:, :, None] + log_probs.reshape(active, live, width)).reshape(active, live * width)
        top = np.argsort(-total, axis=1, kind="stable")[:, :keep_candidates]
        top_scores = np.take_along_axis(total, top, axis=1)
        from_beam = top // width
        token = np.take_along_axis(token_ids.reshape(active, live * width), top, axis=1)
        ends = token == ids.eos

        # A hypothesis finishes when it is among the `beam` best candidates and ends in </s>.
        normaliser = float(step + 1) ** length_penalty
        for slot, rank in zip(*np.nonzero(ends[:, :beam] & np.isfinite(top_scores[:, :beam])), strict=True):
            hyp = tokens[slot, from_beam[slot, rank]].tolist() + [ids.eos]
            finished[sentence[slot]].append((float(top_scores[slot, rank]) / normaliser, hyp))

        # The `beam` best candidates that do not end in </s> continue (stable sort keeps them in score order).
        survivors = np.argsort(ends, axis=1, kind="stable")[:, :beam]
        parent = np.take_along_axis(from_beam, survivors, axis=1)
        scores = np.take_along_axis(top_scores, survivors, axis=1)
        new_tokens = np.take_along_axis(token, survivors, axis=1)
        tokens = np.concatenate([tokens[np.arange(active)[:, None], parent], new_tokens[:, :, None]], axis=2)
        # Each surviving row continues from its parent's cache.
        cache_rows = (np.arange(active)[:, None] * live + parent).reshape(-1)
        self_cache = out.self_cache
        last = new_tokens.reshape(-1)
        step += 1

        done = forced.copy()
        for slot, s in enumerate(sentence):
            if finished[s]:
                finished[s].sort(key=lambda h: -h[0])
                del finished[s][beam:]
                done[slot] |= len(finished[s]) >= beam
        if done.any():
            for s in sentence[done]:
                best[s] = finished[s][0][1]
            keep = ~done
            keep_rows = np.repeat(keep, beam)
            sentence, limit, scores, tokens = sentence[keep], limit[keep], scores[keep], tokens[keep]
            last, encoder_mask, cache_rows = last[keep_rows], encoder_mask[keep], cache_rows[keep_rows]
            cross_cache = [c[keep] for c in cross_cache]
    return best


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id lists into (ids, mask) int64 arrays."""
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length and grouped so rows x longest stays within max_tokens (at least one row each)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * max(lengths[i], 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def strip_hypothesis(ids: Sequence[int], eos_id: int, pad_id: int) -> list[int]:
    """A hypothesis up to and including its first </s>, without padding."""
    ids = list(ids)
    if eos_id in ids:
        ids = ids[: ids.index(eos_id) + 1]
    return [t for t in ids if t != pad_id]


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
        self.manifest = _read_json(self.model_dir / MANIFEST)
        if not self.manifest.get("kv_cache"):
            raise ExportDirError(
                f"{self.model_dir} holds an export without a KV-cached ONNX decoder: export it again "
                "(`dvc repro export`)"
            )
        files = self.manifest.get("files", {}).get("onnx_int8" if int8 else "onnx")
        if not files:
            what = "int8 ONNX graphs (export.int8: true)" if int8 else "ONNX graphs (export.onnx: true)"
            raise ExportDirError(f"{self.model_dir} has no {what}")
        for name in files.values():
            if not (self.model_dir / name).is_file():
                raise ExportDirError(f"{self.model_dir / name} not found (listed in {MANIFEST})")
        self.tokenizer = MarianSentencePiece(self.model_dir)
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.model = OnnxSeq2Seq(self.model_dir / files["encoder"], self.model_dir / files["decoder"], threads=1)
        self.ids = SpecialIds(
            start=self.manifest["decoder_start_id"], eos=self.manifest["eos_id"], pad=self.manifest["pad_id"]
        )
        self.max_positions = int(self.manifest["dims"]["max_positions"])
        self.max_input_tokens = min(max_input_tokens or self.max_positions, self.max_positions)
        self.max_tokens = max_tokens
        generation = self.manifest.get("generation", {})
        self.length_penalty = float(generation.get("length_penalty", 1.0))
        self.max_len_a = float(generation.get("max_len_a", self.manifest.get("max_len", {}).get("a", 1.2)))
        self.max_len_b = int(generation.get("max_len_b", self.manifest.get("max_len", {}).get("b", 10)))

    def max_new_tokens(self, source_length: int) -> int:
        """max_len_a * source_length + max_len_b (source length counting </s>), within the decoder's positions."""
        return max(1, min(int(self.max_len_a * source_length + self.max_len_b), self.max_positions - 1))

    def encode(self, lines: Sequence[str], first_line: int = 1) -> list[list[int] | None]:
        """Ids per line (None for a blank line), truncated to max_input_tokens with a warning."""
        encoded: list[list[int] | None] = []
        for number, line in enumerate(lines, start=first_line):
            if not line.strip():
                encoded.append(None)
                continue
            ids = self.tokenizer.encode(line)
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
        penalty = self.length_penalty if length_penalty is None else length_penalty
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

    def translate(self, lines: Sequence[str], beam: int = 4, length_penalty: float | None = None) -> list[str]:
        if beam < 1:
            raise ValueError(f"beam must be at least 1, got {beam}")
        encoded = self.encode(lines)
        present = [i for i, ids in enumerate(encoded) if ids is not None]
        hyps = self.translate_ids([encoded[i] for i in present], beam=beam, length_penalty=length_penalty)
        out = [""] * len(lines)
        for i, hyp in zip(present, hyps, strict=True):
            # A byte-fallback piece can decode to a line break; the output must stay one line per input line.
            out[i] = " ".join(self.tokenizer.decode(hyp).splitlines())
        return out


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
