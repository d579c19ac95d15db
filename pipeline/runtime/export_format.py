"""The export directory's format: the one contract between the export stage, which writes it, and everything that
reads it (`pipeline.runtime.translate`, the benches). File names, graph input and output names, the cache layout, the
next-token candidates a beam needs, and the manifest `export.json` as a typed, versioned record.

    encoder.onnx  input_ids, attention_mask (batch, src_len) int64
                  -> last_hidden_state (batch, src_len, d_model), cross_key_0, cross_value_0, ... (batch rows)
    decoder.onnx  decoder_input_ids (rows, new_len), encoder_attention_mask (batch, src_len),
                  cache_rows (rows): the row of the given self cache each row continues from,
                  self_key_0, self_value_0, ... (past_rows, past_len long), cross_key_0, cross_value_0, ... (batch rows)
                  -> logits (rows, new_len, vocab),
                     next_log_probs, next_ids (rows, candidates): the best next tokens after the last position,
                        best first, with their log-softmax (<pad> may be among them: a search drops it),
                     present_self_key_0, present_self_value_0, ... (rows, past_len + new_len long)

    decoder.shortlist.onnx   (export.shortlist) the decoder ranking each sentence's shortlist only:
                  decoder.onnx's inputs with, after cache_rows, shortlist (batch, width) int64: each sentence's
                     target ids, <pad> after its last (pipeline/runtime/shortlist.py, whose shortlist.npz lies beside),
                     and shortlist_projection (batch, d_model, width): the output projection's columns of those ids,
                     float32 (int8 in decoder.shortlist.int8.onnx), gathered from shortlist_projection.npz
                  -> next_log_probs, next_ids (rows, candidates), present self cache (no logits)

Caches are one tensor per decoder layer and kind, shaped (rows, heads, length, head_dim); `batch` counts
sentences, `rows` hypotheses: sentences x beams, the beams of sentence s at rows s * beam ... s * beam + beam - 1.
The int8 graphs (`*.int8.onnx`) have the same names; the legacy TorchScript graphs (`*.ts.pt`) have no cache.

The manifest records what was exported and how to decode with it: one `generation` block (the evaluate stage's
beam, length penalty and length rule, see pipeline/runtime/decoding.py) that every reader takes its defaults from.
What the model translates is not the manifest's: the model's directions, its family (which tokenizer files the runtime
reads, pipeline.runtime.text_pieces) and where each direction's special ids go (a source's language code or tag, the
decoder prefix a translation is decoded after) are its `languages.json` (pipeline.runtime.model_languages), the one
record the tokenize stage wrote, so the graphs and the search know nothing of languages. A manifest of another
version is refused with "export it again": its fields may mean something else.

Beside the graphs lie the tokenizer files (Marian: source.spm, target.spm, vocab.json; M2M-100: vocab.json,
sentencepiece.bpe.model; mBART, mBART-50, NLLB: tokenizer.json; and tokenizer_config.json), config.json,
generation_config.json and `languages.json` (the directions, the family's language codes and each direction's
layout, as the tokenize stage recorded them), all copied from models/final; `export.json` lists them under
`model_files`.

Imports the standard library and, through pipeline.runtime.decoding, numpy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.errors import PipelineError

MANIFEST = "export.json"
# 4: one `generation` block (the duplicate `max_len` block of version 3 is gone).
# 5: `directions` and `target_tags` (a model may translate several directions; its sources may carry a tag).
# 6: `family` (a pretrained checkpoint's family: its tokenizer files and language codes); `decoder_start_id` may be
#    null (mBART-cc25 starts from the target's code: the layouts say), `target_tags` is read off the layouts.
# 7: no `family`, `directions` or `target_tags`: languages.json, the model's one record of them, says.
MANIFEST_VERSION = 7
GRAPHS = ("encoder", "decoder")
ONNX_FILES = {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}
ONNX_INT8_FILES = {"encoder": "encoder.int8.onnx", "decoder": "decoder.int8.onnx"}
TORCHSCRIPT_FILES = {"encoder": "encoder.ts.pt", "decoder": "decoder.ts.pt"}
CTRANSLATE2_DIR = "ctranslate2"
# The manifest's `files.shortlist`: the table, the output projection's rows per target id (arrays `onnx` and
# `onnx_int8`: float32 and int8, in the shortlisted graph's input type) and the shortlisted decoder of each ONNX
# precision exported.
SHORTLIST_FILES = {"table": "shortlist.npz", "projection": "shortlist_projection.npz",
                   "onnx": "decoder.shortlist.onnx", "onnx_int8": "decoder.shortlist.int8.onnx"}
SHORTLIST_INPUT = "shortlist"
SHORTLIST_PROJECTION_INPUT = "shortlist_projection"

ENCODER_INPUTS = ("input_ids", "attention_mask")
DECODER_FIRST_INPUTS = ("decoder_input_ids", "encoder_attention_mask", "cache_rows")
DECODER_FIRST_OUTPUTS = ("logits", "next_log_probs", "next_ids")
# The legacy TorchScript graphs have no cache: the decoder takes the whole prefix and the encoder states.
TORCHSCRIPT_INPUTS = {
    "encoder": ["input_ids", "attention_mask"],
    "decoder": ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"],
}
TORCHSCRIPT_OUTPUTS = {"encoder": ["last_hidden_state"], "decoder": ["logits"]}
CACHE_LAYOUT = ("batch", "heads", "length", "head_dim")


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


def shortlisted_decoder_inputs(layers: int) -> list[str]:
    return [*DECODER_FIRST_INPUTS, SHORTLIST_INPUT, SHORTLIST_PROJECTION_INPUT, *cache_names("self", layers),
            *cache_names("cross", layers)]


def shortlisted_decoder_outputs(layers: int) -> list[str]:
    return decoder_outputs(layers)[1:]


@dataclass(frozen=True)
class ShortlistFiles:
    """A shortlisted decoder's files, by name within the export: the table, the projection rows (array
    `precision` of that file) and the graph."""

    table: str
    projection: str
    precision: str
    graph: str


class ExportDirError(PipelineError):
    """The directory is not a complete export of this version (with a KV-cached ONNX decoder where one is needed)."""


def read_export_json(path: Path) -> Any:
    """A JSON file of an export directory (the manifest, the tokenizer's files); ExportDirError naming it when it
    is missing or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportDirError(f"{path} not found: is {path.parent} an export directory (`dvc repro export`)?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ExportDirError(f"{path}: not valid JSON ({err})") from None


@dataclass(frozen=True)
class Generation:
    """Decoding defaults: the evaluate stage's settings, so `mtpipe translate` decodes as evaluate scored.
    The output length rule is pipeline.runtime.decoding.output_limit over max_len_a and max_len_b."""

    beam: int
    length_penalty: float
    max_len_a: float
    max_len_b: int


@dataclass(frozen=True)
class ModelDims:
    d_model: int
    encoder_layers: int
    decoder_layers: int
    attention_heads: int
    max_positions: int


@dataclass(frozen=True)
class ExportManifest:
    """What `export.json` says. `files` maps each exported format to its graph files ({graph: file name}), or,
    for ctranslate2, to its directory; `special_ids.start` is None where the directions start from different tokens
    (the layouts hold each one); `parity` holds the parity check's figures (informational: overall, and per direction
    under "directions")."""

    files: Mapping[str, Any]
    model_files: tuple[str, ...]
    opset: int | None
    kv_cache: bool
    next_token_candidates: int | None
    vocab_size: int
    special_ids: SpecialIds
    dims: ModelDims
    generation: Generation
    parity: Mapping[str, Any] = field(default_factory=dict)
    version: int = MANIFEST_VERSION

    def onnx_graphs(self, int8: bool = False) -> Mapping[str, str] | None:
        """{graph: file name} of the fp32 (or int8) ONNX graphs; None when they were not exported."""
        return self.files.get("onnx_int8" if int8 else "onnx")

    def shortlisted_decoder(self, int8: bool = False) -> ShortlistFiles | None:
        """The shortlist's files for the fp32 (or int8) graphs; None when the export has no shortlist
        (export.shortlist: false). An export whose shortlisted decoder is of the whole-vocabulary projection
        before it (no projection file) is an ExportDirError: export it again."""
        shortlist = self.files.get("shortlist") or {}
        precision = "onnx_int8" if int8 else "onnx"
        if precision not in shortlist:
            return None
        if "projection" not in shortlist:
            raise ExportDirError(f"this export's shortlisted decoder ({shortlist[precision]}) is of an earlier "
                                 "version: export it again (`dvc repro export`)")
        return ShortlistFiles(shortlist["table"], shortlist["projection"], precision, shortlist[precision])

    def to_json(self) -> dict[str, Any]:
        layers = self.dims.decoder_layers
        onnx_inputs = {"encoder": list(ENCODER_INPUTS), "decoder": decoder_inputs(layers)}
        onnx_outputs = {"encoder": encoder_outputs(layers), "decoder": decoder_outputs(layers)}
        if "shortlist" in self.files:
            onnx_inputs["decoder_shortlist"] = shortlisted_decoder_inputs(layers)
            onnx_outputs["decoder_shortlist"] = shortlisted_decoder_outputs(layers)
        return {
            "version": self.version,
            "files": dict(self.files),
            "model_files": list(self.model_files),
            "opset": self.opset,
            "kv_cache": self.kv_cache,
            "inputs": {"onnx": onnx_inputs, "torchscript": TORCHSCRIPT_INPUTS},
            "outputs": {"onnx": onnx_outputs, "torchscript": TORCHSCRIPT_OUTPUTS},
            "cache_layout": list(CACHE_LAYOUT),
            "next_token_candidates": self.next_token_candidates,
            "vocab_size": self.vocab_size,
            "pad_id": self.special_ids.pad,
            "eos_id": self.special_ids.eos,
            "decoder_start_id": self.special_ids.start,
            # Generation must never emit <pad> (Marian starts from it) and forces </s> at the length limit.
            "bad_words_ids": [[self.special_ids.pad]],
            "dims": vars(self.dims).copy(),
            "generation": vars(self.generation).copy(),
            "parity": dict(self.parity),
        }

    def write(self, directory: str | os.PathLike[str]) -> None:
        # The export stage writes it inside the directory it publishes atomically.
        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False)
        (Path(directory) / MANIFEST).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> ExportManifest:
        """The manifest of an export directory; ExportDirError naming the file and the field when it is missing,
        malformed, or of another version."""
        path = Path(directory) / MANIFEST
        fields = _ManifestFields(path, read_export_json(path))
        version = fields.get("version", int)
        if version != MANIFEST_VERSION:
            raise ExportDirError(f"{path} is export format version {version}, this code reads version "
                                 f"{MANIFEST_VERSION}: export it again (`dvc repro export`)")
        return cls(
            files=fields.get("files", dict),
            model_files=tuple(fields.get("model_files", list)),
            opset=fields.get("opset", int, optional=True),
            kv_cache=fields.get("kv_cache", bool),
            next_token_candidates=fields.get("next_token_candidates", int, optional=True),
            vocab_size=fields.get("vocab_size", int),
            special_ids=SpecialIds(start=fields.get("decoder_start_id", int, optional=True),
                                   eos=fields.get("eos_id", int), pad=fields.get("pad_id", int)),
            dims=ModelDims(**{name: fields.get(f"dims.{name}", int) for name in ModelDims.__dataclass_fields__}),
            generation=Generation(
                beam=fields.get("generation.beam", int),
                length_penalty=float(fields.get("generation.length_penalty", float)),
                max_len_a=float(fields.get("generation.max_len_a", float)),
                max_len_b=fields.get("generation.max_len_b", int),
            ),
            parity=fields.get("parity", dict),
            version=version,
        )


_JSON_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "an object",
                    list: "a list"}


@dataclass(frozen=True)
class _ManifestFields:
    """Typed access to the parsed JSON of one manifest file, for errors that name the file and the field."""

    path: Path
    data: Any

    def get(self, dotted: str, kind: type, optional: bool = False) -> Any:
        """The value at `dotted` (e.g. "generation.beam") if it has JSON type `kind` (an int passes for a float;
        a bool never passes for a number); None for an optional field that is null."""
        node = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ExportDirError(f"{self.path}: field {dotted!r} is missing: export it again (`dvc repro export`)")
            node = node[part]
        if node is None and optional:
            return None
        accepted = (int, float) if kind is float else (kind,)
        if not isinstance(node, accepted) or (kind is not bool and isinstance(node, bool)):
            raise ExportDirError(f"{self.path}: field {dotted!r} is {node!r}, not {_JSON_TYPE_NAMES[kind]}")
        return node
