"""The ONNX graphs (`export.onnx`): encoder.onnx and the KV-cached decoder.onnx, weights inside, every batch and length
dim dynamic, and their int8 versions (`export.int8`). The encoder also computes every decoder layer's cross-attention
keys and values, once per sentence; the decoder appends the new tokens' self-attention keys and values to the ones it
is given, so a step costs O(length) instead of re-running the prefix, takes `cache_rows` (the row of the given cache
each row continues from, so beam search reorders hypotheses without copying caches) and returns the next-token
candidates a beam of `evaluate.beam` needs, so the search sorts no vocabulary in numpy. With `export.shortlist`,
decoder.shortlist.onnx is the same decoder projecting onto and ranking each sentence's shortlist instead
(wrappers.ShortlistedDecoder; its projection: shortlist_projection.py).
Caches are one (rows, heads,
length, head_dim) tensor per layer and kind: stacking them would make the graph split and re-stack the whole cache at
every step. The int8 graphs are onnxruntime's dynamic quantisation of every MatMul with a weight (the output
projection included), activations quantised per call; the embedding lookups stay fp32. Names and layout:
pipeline/runtime/export_format.py; the traced modules: wrappers.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch

from pipeline.runtime.export_format import (
    ENCODER_INPUTS,
    GRAPHS,
    ONNX_FILES,
    ONNX_INT8_FILES,
    SHORTLIST_FILES,
    SHORTLIST_INPUT,
    SHORTLIST_PROJECTION_INPUT,
    decoder_inputs,
    decoder_outputs,
    encoder_outputs,
    shortlisted_decoder_inputs,
    shortlisted_decoder_outputs,
)
from stages.export.quiet import quiet_exporters, quiet_quantizer
from stages.export.shortlist_projection import quantise_projection, write_projection_rows
from stages.export.wrappers import export_wrappers, shortlisted_decoder

log = logging.getLogger("mtpipe.export")


@dataclass(frozen=True)
class GraphExport:
    """What torch.onnx.export needs for one graph."""

    module: torch.nn.Module
    args: tuple[Any, ...]
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: dict[str, Any]


def graph_exports(model: Any, example: dict[str, torch.Tensor], beam: int, shortlist: bool = False
                  ) -> dict[str, GraphExport]:
    """The encoder's and the cached decoder's export jobs (and the shortlisted decoder's), with example inputs where
    no dim is 0 or 1."""
    encoder, decoder = export_wrappers(model, beam)
    layers = model.config.decoder_layers
    max_positions = model.config.max_position_embeddings
    batch = torch.export.Dim("batch")  # sentences
    rows = torch.export.Dim("rows")  # hypotheses: sentences x beams
    past_rows = torch.export.Dim("past_rows")  # rows of the cache the hypotheses continue from
    src_len = torch.export.Dim("src_len", max=max_positions)
    past_len = torch.export.Dim("past_len", max=max_positions)
    new_len = torch.export.Dim("new_len", max=max_positions)
    with torch.no_grad():
        _, *cross_cache = encoder(example["input_ids"], example["attention_mask"])
    # 2 sentences x 3 beams continuing from a cache of 4 rows (2 sentences x 2 beams, as after a step that dropped
    # a sentence), 3 tokens long, for 2 new tokens: no dim is 0 or 1, which torch.export would specialise, and
    # rows, cache rows and sentences differ. Every cache tensor must be a distinct object: the exporter merges
    # inputs that are the same tensor into one graph input.
    generator = torch.Generator().manual_seed(0)
    _, heads, _, head_dim = cross_cache[0].shape
    beams_per_sentence = 3
    decoder_input_ids = example["decoder_input_ids"][:, :2].repeat_interleave(beams_per_sentence, dim=0)
    cache_rows = torch.tensor([0, 1, 1, 2, 3, 3])
    self_cache = [torch.randn(4, heads, 3, head_dim, generator=generator) for _ in range(2 * layers)]
    decoder_shapes = {
        "decoder_input_ids": {0: rows, 1: new_len},
        "encoder_attention_mask": {0: batch, 1: src_len},
        "cache_rows": {0: rows},
        "self_cache": [{0: past_rows, 2: past_len}] * (2 * layers),
        "cross_cache": [{0: batch, 2: src_len}] * (2 * layers),
    }
    decoder_args = (decoder_input_ids, example["attention_mask"], cache_rows, self_cache, cross_cache)
    jobs = {
        "encoder": GraphExport(
            encoder,
            (example["input_ids"], example["attention_mask"]),
            list(ENCODER_INPUTS),
            encoder_outputs(layers),
            {"input_ids": {0: batch, 1: src_len}, "attention_mask": {0: batch, 1: src_len}},
        ),
        "decoder": GraphExport(decoder, decoder_args, decoder_inputs(layers), decoder_outputs(layers),
                               decoder_shapes),
    }
    if shortlist:
        jobs["decoder_shortlist"] = shortlisted_decoder_export(model, beam, decoder.candidates, decoder_args,
                                                                decoder_shapes, batch, generator)
    return jobs


def shortlisted_decoder_export(model: Any, beam: int, candidates: int, decoder_args: tuple[Any, ...],
                               decoder_shapes: dict[str, Any], batch: Any, generator: torch.Generator) -> GraphExport:
    """The shortlisted decoder's export job: the cached decoder's example inputs with each sentence's shortlist and
    its columns of the output projection inserted after `cache_rows`."""
    # Each sentence's shortlist: a few more ids than the candidates (which need no more), <pad> after the last.
    width = candidates + 3
    vocab = model.config.vocab_size
    ids = torch.randperm(vocab, generator=generator)[: 2 * width].reshape(2, width).sort(dim=1).values
    ids[1, -2:] = model.config.pad_token_id
    columns = model.lm_head.weight.detach()[ids].transpose(1, 2).contiguous()  # (2, d_model, width)
    width_dim = torch.export.Dim("width", min=candidates, max=vocab)
    layers = model.config.decoder_layers
    return GraphExport(
        shortlisted_decoder(model, beam),
        (*decoder_args[:3], ids, columns, *decoder_args[3:]),
        shortlisted_decoder_inputs(layers),
        shortlisted_decoder_outputs(layers),
        # In the order of the arguments: the exporter names the graph's dims by it.
        {**{name: decoder_shapes[name] for name in ("decoder_input_ids", "encoder_attention_mask", "cache_rows")},
         SHORTLIST_INPUT: {0: batch, 1: width_dim},
         SHORTLIST_PROJECTION_INPUT: {0: batch, 2: width_dim},
         **{name: decoder_shapes[name] for name in ("self_cache", "cross_cache")}},
    )


# Where each graph is written.
ONNX_PATHS = {**ONNX_FILES, "decoder_shortlist": SHORTLIST_FILES["onnx"]}
INT8_PATHS = {**ONNX_INT8_FILES, "decoder_shortlist": SHORTLIST_FILES["onnx_int8"]}


def export_onnx(model: Any, example: dict[str, torch.Tensor], out: Path, opset: int, beam: int,
                shortlist: bool = False, int8: bool = False) -> dict[str, float]:
    """Write encoder.onnx and decoder.onnx into `out` (the decoder returns the candidates a beam of width `beam`
    needs), and decoder.shortlist.onnx and its projection rows with `shortlist` (the int8 rows too with `int8`,
    for quantize_int8's graph); returns the seconds per graph."""
    seconds = {}
    if shortlist:
        write_projection_rows(model, out, int8)
    for graph, job in graph_exports(model, example, beam, shortlist).items():
        path = out / ONNX_PATHS[graph]
        log.info("exporting the %s to ONNX (opset %d)", graph, opset)
        start = time.perf_counter()
        with quiet_exporters(), torch.no_grad():
            torch.onnx.export(
                job.module,
                job.args,
                str(path),
                dynamo=True,
                external_data=False,
                opset_version=opset,
                input_names=job.input_names,
                output_names=job.output_names,
                dynamic_shapes=job.dynamic_shapes,
                verbose=False,
            )
        seconds[graph] = round(time.perf_counter() - start, 2)
        drop_stack_traces(path)
        onnx.checker.check_model(str(path))
    return seconds


STACK_TRACE = "pkg.torch.onnx.stack_trace"


def drop_stack_traces(path: Path) -> None:
    """Remove the Python stack trace torch's exporter attaches to every node: it names the source files by their
    absolute paths, so the same model exported from two directories gave two different files (and a third of the
    metadata's bytes). The other node metadata (module scopes, the FX node) stays for debugging."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
    onnx.save(model, str(path))


def quantize_int8(out: Path, shortlist: bool = False) -> float:
    """encoder.int8.onnx and decoder.int8.onnx (and decoder.shortlist.int8.onnx with `shortlist`) from the fp32
    graphs in `out`: int8 weights (a scale per output column), activations quantised at run time; returns seconds.

    MatMuls only: a quantised Gather (the embeddings) would be dequantised in full at every call. A scale per
    output column (per_channel) gave a BLEU closer to fp32 than one scale per matrix, at the same speed
    (bench/README.md)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    start = time.perf_counter()
    for graph in [*GRAPHS, "decoder_shortlist"] if shortlist else GRAPHS:
        log.info("quantising the %s to int8 (dynamic)", graph)
        with quiet_quantizer():
            quantize_dynamic(out / ONNX_PATHS[graph], out / INT8_PATHS[graph], weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"], per_channel=True)
    if shortlist:
        quantise_projection(out, out / INT8_PATHS["decoder_shortlist"])
    return round(time.perf_counter() - start, 2)
