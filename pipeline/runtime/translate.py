"""Translate with an exported model (`models/export`) on ONNX Runtime: no torch, no transformers.

    from pipeline.runtime.translate import Translator
    Translator("models/export").translate(["A dog runs.", "", "Two men talk."], beam=4)
    Translator("models/multi").translate(["A dog runs."], tgt="fr")    # a model of several targets

A model translates the directions of its `languages.json` (pipeline/runtime/model_languages.py).
With one target language `tgt` may be left out; with several it names the target; `src` is needed only where
several source languages go into that target. An unknown or missing choice is an UnknownDirection listing the
model's targets and directions.

Every checkpoint family (pipeline.runtime.families: Marian, mBART, mBART-50, M2M-100, NLLB) is read the same way,
through its direction's layout (pipeline.runtime.model_languages, recorded in languages.json): a source is the layout's
special ids around the text's plain pieces (the Marian `>>fr<<` tag in front for a multi-target model, mBART's `</s>
en_XX` after, mBART-50/M2M-100/NLLB's source code in front and `</s>` after), and a translation is decoded after
the direction's decoder prefix (the start token, then the target's code where the family has one), so the model
writes the direction's target language; the translation is what follows the prefix.

The export directory's format (graph names, cache layout, the manifest `export.json`) is
pipeline/runtime/export_format.py; the search is pipeline/runtime/beam_search.py; batching, padding and the output
length rule are pipeline/runtime/decoding.py; the family's tokenizer is pipeline/runtime/text_pieces.py. This module
runs the graphs (`OnnxSeq2Seq`) and puts them together (`Translator`).

The encoder also projects its states into every decoder layer's cross-attention keys and values, once per
sentence, and they stay one per sentence (a sentence's beams attend to them together). The decoder takes the
self-attention keys and values of the tokens decoded so far and returns them extended by the new ones, so a
decoding step feeds one token per row and costs O(length), not the whole prefix again; the first step passes an
empty (past_len 0) cache. The decoder also returns each row's best next tokens for the beam it was exported for
(ONNX Runtime's TopK is much faster than numpy over the vocabulary); searching asks for those and the caches only,
so the full logits are neither copied out nor sorted. The first step feeds the whole decoder prefix at once.

An export with a lexical shortlist (export.shortlist; pipeline/runtime/shortlist.py) is decoded with its shortlisted
decoder unless `shortlist=False`: each sentence's next token is projected onto and ranked among the target ids its
source makes likely (the Multi30k student's int8 decodes about 1.5x faster so, at 0.2 BLEU less: bench/README.md;
the export's metrics report its BLEU on the parity sentences). A beam wider than the graphs were exported for falls
back to the full decoder, which ranks from the logits.

Decoding defaults (beam, length penalty, length rule) are the manifest's `generation` block: the evaluate stage's
settings, so a translation here is the one the evaluate stage scored.

Tokenization is the checkpoint's transformers tokenizer's, reimplemented over the tokenizer files of the export
directory (pipeline.runtime.text_pieces: transformers is a 1-2 s import and this path must start fast).

Imports numpy and, when a model is loaded, onnxruntime and sentencepiece or tokenizers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from pipeline.runtime.beam_search import Cache, DecoderStep, beam_search_nbest
from pipeline.runtime.decoding import limit_after_prefix, one_line, pad_batch, token_batches
from pipeline.runtime.errors import InputFileError, PipelineError
from pipeline.runtime.export_format import (
    DECODER_FIRST_INPUTS,
    DECODER_FIRST_OUTPUTS,
    ENCODER_INPUTS,
    MANIFEST,
    SHORTLIST_INPUT,
    SHORTLIST_PROJECTION_INPUT,
    ExportDirError,
    ExportManifest,
    cache_names,
    candidates_for_beam,
    decoder_inputs,
    shortlisted_decoder_inputs,
)
from pipeline.runtime.languages import Direction
from pipeline.runtime.model_languages import DirectionLayout, ModelLanguages
from pipeline.runtime.shortlist import Shortlist, projection_columns, read_projection
from pipeline.runtime.text_pieces import MarianSentencePiece, TextPieces, TokenizerFilesError, text_pieces

# MarianSentencePiece lived here before pipeline.runtime.text_pieces: callers still import it from this module.
__all__ = ["MarianSentencePiece", "OnnxSeq2Seq", "Translator", "read_lines"]

log = logging.getLogger("mtpipe.translate")

DEFAULT_THREADS = 2
# Rows x longest source per encoder call, beams included: bounds the memory of the caches and the logits.
DEFAULT_MAX_TOKENS = 6000


# --------------------------------------------------------------------------------------------------- runtime


# Graph rewrites ONNX Runtime would apply that make these graphs slower on CPUs: its fused SkipLayerNormalization
# kernel is slower than the Add + LayerNormalization it replaces here, in int8 and fp32 (bench/README.md).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def ort_session(path: Path, threads: int = DEFAULT_THREADS, profile_prefix: str | None = None) -> Any:
    """A CPU session over the graph at `path`, `threads` intra-op threads. `profile_prefix`: ONNX Runtime's
    profiler on, its trace written to `<profile_prefix>_<time>.json` by end_profiling() (bench/decode_profile.py)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=DISABLED_OPTIMIZERS)


@dataclass(frozen=True)
class BatchShortlist:
    """What a shortlisted decoder needs besides its graph: the table, the id that pads a sentence's list, and the
    output projection's (vocab, d_model) rows in the graph's input type."""

    table: Shortlist
    pad_id: int
    projection: np.ndarray

    def for_batch(self, input_ids: np.ndarray, attention_mask: np.ndarray, minimum: int
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(shortlists (sentences, width), their projection columns (sentences, d_model, width)) of a batch."""
        shortlists = self.table.for_batch(input_ids, attention_mask, self.pad_id, minimum)
        return shortlists, projection_columns(self.projection, shortlists)


class OnnxSeq2Seq:
    """The encoder and KV-cached decoder sessions, called with numpy arrays.

    With `shortlist`, the decoder is a shortlisted one (decoder.shortlist.onnx): `encode` returns each sentence's
    shortlist and its projection columns after its cross cache, as two more per-sentence arrays that the search
    carries (and drops with a finished sentence) like the cross cache, and `decode` feeds them to the graph."""

    def __init__(self, encoder_path: Path, decoder_path: Path, threads: int = DEFAULT_THREADS,
                 shortlist: BatchShortlist | None = None):
        self.encoder_path, self.decoder_path = encoder_path, decoder_path
        self.encoder = ort_session(encoder_path, threads)
        self.decoder = ort_session(decoder_path, threads)
        self.shortlist = shortlist
        inputs = self.decoder.get_inputs()
        self.layers = sum(i.name.startswith("self_key_") for i in inputs)
        names = [i.name for i in inputs]
        expected = shortlisted_decoder_inputs if shortlist else decoder_inputs
        if not self.layers or names != expected(self.layers):
            raise ExportDirError(
                f"{decoder_path} has inputs {names}, not a KV-cached {'shortlisted ' if shortlist else ''}decoder's: "
                "export it again with this version (`dvc repro export`)"
            )
        # (heads, head_dim) of the caches, from the graph's static dims.
        _, heads, _, head_dim = inputs[names.index("self_key_0")].shape
        self.heads, self.head_dim = int(heads), int(head_dim)
        self.self_cache_names = cache_names("self", self.layers)
        self.cross_cache_names = cache_names("cross", self.layers)
        outputs = [o.name for o in self.decoder.get_outputs()]
        # What a search step reads: every output but `logits`.
        self.search_outputs = [name for name in outputs if name != DECODER_FIRST_OUTPUTS[0]]
        # Next-token candidates per row the graph returns (a static dim).
        self.candidates = int(self.decoder.get_outputs()[outputs.index("next_ids")].shape[1])

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Cache]:
        """(last_hidden_state, cross cache), the cross cache followed by the sentences' shortlists and their
        projection columns if shortlisted."""
        hidden, *cross = self.encoder.run(None, dict(zip(ENCODER_INPUTS, (input_ids, attention_mask), strict=True)))
        if self.shortlist is not None:
            cross += self.shortlist.for_batch(input_ids, attention_mask, self.candidates)
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
        candidates and the cache. A shortlisted decoder has no logits to give."""
        if cache_rows is None:
            cache_rows = np.arange(len(decoder_input_ids), dtype=np.int64)
        first = (decoder_input_ids, encoder_attention_mask, cache_rows)
        feeds = dict(zip(DECODER_FIRST_INPUTS, first, strict=True))
        if self.shortlist is not None:
            *cross_cache, feeds[SHORTLIST_INPUT], feeds[SHORTLIST_PROJECTION_INPUT] = cross_cache
            if logits:
                raise ValueError("a shortlisted decoder returns next-token candidates, not logits")
        feeds.update(zip(self.self_cache_names, self_cache, strict=True))
        feeds.update(zip(self.cross_cache_names, cross_cache, strict=True))
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

    `shortlist`: decode with the export's lexical shortlist where it has one (see the module docstring).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        int8: bool = False,
        threads: int = DEFAULT_THREADS,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_input_tokens: int | None = None,
        shortlist: bool = True,
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
        try:
            self.languages = ModelLanguages.read(self.model_dir)
        except PipelineError as err:
            raise ExportDirError(f"{err}; or export it again (`dvc repro export`)") from None
        self.directions = self.languages.directions
        try:
            # The layouts' ids (codes, tags, the decoder's start) never belong in a translation's text.
            self.tokenizer: TextPieces = text_pieces(self.model_dir, self.languages.family.name,
                                                     skip_ids=self.languages.special_ids,
                                                     tagged=self.languages.target_tags)
        except TokenizerFilesError as err:
            raise ExportDirError(f"{err}: export it again (`dvc repro export`)") from None
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.ids = self.manifest.special_ids
        self.graphs = files  # {graph: file name} of the precision asked for
        self.model = self._onnx_model(files, int8, shortlist)
        self._full_model: OnnxSeq2Seq | None = None
        self.max_positions = self.manifest.dims.max_positions
        self.max_input_tokens = min(max_input_tokens or self.max_positions, self.max_positions)
        self.max_tokens = max_tokens
        self.generation = self.manifest.generation

    def _onnx_model(self, files: Any, int8: bool, shortlist: bool) -> OnnxSeq2Seq:
        """The sessions translating runs: over the shortlisted decoder where asked for and exported."""
        encoder, decoder = self.model_dir / files["encoder"], self.model_dir / files["decoder"]
        shortlisted = self.manifest.shortlisted_decoder(int8) if shortlist else None
        if shortlisted is None:
            return OnnxSeq2Seq(encoder, decoder, threads=1)
        graph = self.model_dir / shortlisted.graph
        if not graph.is_file():
            raise ExportDirError(f"{graph} not found (listed in {MANIFEST})")
        projection = read_projection(self.model_dir / shortlisted.projection, shortlisted.precision)
        batch_shortlist = BatchShortlist(Shortlist.read(self.model_dir / shortlisted.table), self.ids.pad, projection)
        return OnnxSeq2Seq(encoder, graph, threads=1, shortlist=batch_shortlist)

    def model_for(self, beam: int) -> OnnxSeq2Seq:
        """The sessions a search of width `beam` runs on: a shortlisted decoder returns no logits, so a beam wider
        than its candidates serve is decoded over the whole vocabulary instead (the full decoder, loaded then)."""
        if self.model.shortlist is None or self.model.candidates >= candidates_for_beam(beam):
            return self.model
        if self._full_model is None:
            log.info("beam %d is wider than the shortlisted decoder was exported for: decoding without the shortlist",
                     beam)
            self._full_model = OnnxSeq2Seq(self.model_dir / self.graphs["encoder"],
                                           self.model_dir / self.graphs["decoder"], threads=1)
        return self._full_model

    def max_new_tokens(self, source_length: int, prefix_length: int = 1) -> int:
        """Most tokens a translation of a source this long (</s> included) may have after a decoder prefix this
        long: the manifest's length rule, within the decoder positions the prefix leaves (as the evaluate stage
        cuts it)."""
        return limit_after_prefix(source_length, self.generation.max_len_a, self.generation.max_len_b,
                                  self.max_positions, prefix_length)

    def direction(self, tgt: str | None = None, src: str | None = None) -> Direction:
        """The direction asked for (either language may be left out where the model leaves no choice);
        UnknownDirection listing the model's targets and directions otherwise."""
        return self.directions.find(src, tgt)

    def layout(self, direction: Direction | None = None) -> DirectionLayout:
        """Where `direction`'s special ids go (default: the model's only direction)."""
        return self.languages.layout(direction or self.direction())

    def source_ids(self, line: str, direction: Direction) -> list[int]:
        """A line's ids as the model reads them for `direction`: the layout's special ids (language code or tag,
        </s>) around the line's pieces, untruncated."""
        return self.layout(direction).source(self.tokenizer.pieces(line))

    def encode(self, lines: Sequence[str], direction: Direction | None = None,
               first_line: int = 1) -> list[list[int] | None]:
        """Ids per line for `direction` (default: the model's only one), None for a blank line, truncated to
        max_input_tokens with a warning (the layout's special ids stay: the first pieces are kept)."""
        layout = self.layout(direction)
        framing = len(layout.source_prefix) + len(layout.source_suffix)
        encoded: list[list[int] | None] = []
        for number, line in enumerate(lines, start=first_line):
            if not line.strip():
                encoded.append(None)
                continue
            pieces = self.tokenizer.pieces(line)
            if len(pieces) + framing > self.max_input_tokens:
                log.warning(
                    "line %d: %d source tokens, more than the %d the model takes; translating its first %d",
                    number, len(pieces) + framing, self.max_input_tokens, self.max_input_tokens,
                )
                pieces = pieces[: max(self.max_input_tokens - framing, 0)]
            encoded.append(layout.source(pieces))
        return encoded

    def translate_ids(self, sources: Sequence[Sequence[int]], beam: int = 4, length_penalty: float | None = None,
                      direction: Direction | None = None) -> list[list[int]]:
        """Hypothesis ids (after the decoder prefix of `direction`, default the model's only one; with </s>) per
        source, in input order, batched by tokens; `threads` batches at once."""
        return [nbest[0] for nbest in self.hypotheses_ids(sources, beam, length_penalty, direction)]

    def hypotheses_ids(self, sources: Sequence[Sequence[int]], beam: int = 4, length_penalty: float | None = None,
                       direction: Direction | None = None) -> list[list[list[int]]]:
        """As translate_ids, but each source's n-best list (the beam's finished hypotheses, best first: up to
        `beam` of them) instead of its best."""
        penalty = self.generation.length_penalty if length_penalty is None else length_penalty
        prefix = self.layout(direction).decoder_prefix
        budget = max(self.max_tokens // beam, 1)
        if self.threads > 1:  # small inputs too are split so that every thread has a batch
            budget = min(budget, max(sum(len(s) for s in sources) // self.threads, 1))
        batches = token_batches([len(s) for s in sources], budget)
        # The longest-running batches start first, so the last ones to start are short and threads finish together.
        batches.sort(key=lambda batch: len(batch) * len(sources[batch[-1]]), reverse=True)
        model = self.model_for(beam)

        def search(batch: list[int]) -> list[list[list[int]]]:
            rows = [sources[i] for i in batch]
            input_ids, attention_mask = pad_batch(rows, self.ids.pad)
            limits = [self.max_new_tokens(len(r), len(prefix)) for r in rows]
            return beam_search_nbest(model, input_ids, attention_mask, beam=beam, max_new_tokens=limits,
                                     ids=self.ids, length_penalty=penalty, decoder_prefix=prefix)

        out: list[list[list[int]]] = [[] for _ in sources]
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
        direction = self.direction(tgt, src)
        encoded = self.encode(lines, direction)
        present = [i for i, ids in enumerate(encoded) if ids is not None]
        hyps = self.translate_ids([encoded[i] for i in present], beam=beam, length_penalty=length_penalty,
                                  direction=direction)
        out = [""] * len(lines)
        for i, hyp in zip(present, hyps, strict=True):
            # A byte-fallback piece can decode to a line break; the output must stay one line per input line.
            out[i] = one_line(self.tokenizer.decode(hyp))
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
