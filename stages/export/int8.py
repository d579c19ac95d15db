"""The int8 ONNX graphs: onnxruntime dynamic quantisation of every MatMul with a weight (the output projection
included), activations quantised per call; the embedding lookups stay fp32."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pipeline.runtime.export_format import GRAPHS, ONNX_FILES, ONNX_INT8_FILES
from stages.export.quiet import quiet_quantizer

log = logging.getLogger("mtpipe.export")


def quantize_int8(out: Path) -> float:
    """encoder.int8.onnx and decoder.int8.onnx from the fp32 graphs in `out`: int8 weights (a scale per output
    column), activations quantised at run time; returns seconds.

    MatMuls only: a quantised Gather (the embeddings) would be dequantised in full at every call. A scale per
    output column (per_channel) gave a BLEU closer to fp32 than one scale per matrix, at the same speed
    (bench/README.md)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    start = time.perf_counter()
    for graph in GRAPHS:
        log.info("quantising the %s to int8 (dynamic)", graph)
        with quiet_quantizer():
            quantize_dynamic(out / ONNX_FILES[graph], out / ONNX_INT8_FILES[graph], weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"], per_channel=True)
    return round(time.perf_counter() - start, 2)
