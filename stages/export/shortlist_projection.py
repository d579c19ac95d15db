"""The shortlisted decoder's output projection (`export.shortlist`): the graph takes each sentence's columns of it as
an input (wrappers.ShortlistedDecoder), gathered by the runtime once per batch from the rows written here
(shortlist_projection.npz, read by pipeline/runtime/shortlist.py): float32 for decoder.shortlist.onnx and int8 for
decoder.shortlist.int8.onnx, whose projection this module rewrites to multiply in int8.

onnxruntime's dynamic quantisation quantises a MatMul's weight only when it is an initializer, so it leaves the
projection of the shortlisted graph in fp32. The rewrite gives it the int8 weights of the whole-vocabulary int8
decoder's kind instead: one symmetric scale per target id (per output column, as `per_channel`), the int8 columns fed
as the input and multiplied by DynamicQuantizeMatMul (activations quantised per call, as in every int8 MatMul of
these graphs), then each column scaled by its id's scale, which the graph gathers from a table it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.runtime.export_format import SHORTLIST_FILES, SHORTLIST_INPUT, SHORTLIST_PROJECTION_INPUT

INT8_MAX = 127
SCALES = "shortlist_projection_scale"
UNIT_SCALE = "shortlist_projection_unit_scale"
ZERO_POINT = "shortlist_projection_zero_point"
SCALE_AXES = "shortlist_projection_scale_axes"


def write_projection_rows(model: Any, out: Path, int8: bool = False) -> None:
    """shortlist_projection.npz in `out`: lm_head's (vocab, d_model) weight as the fp32 graph's rows (`onnx`), and
    with `int8` their int8 rows for the int8 graph (`onnx_int8`), whose scales quantise_projection puts in the graph."""
    rows = np.ascontiguousarray(model.lm_head.weight.detach().float().cpu().numpy(), dtype=np.float32)
    arrays = {"onnx": rows, "onnx_int8": int8_rows(rows)[0]} if int8 else {"onnx": rows}
    np.savez(out / SHORTLIST_FILES["projection"], **arrays)


def int8_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scale per row): symmetric, the row's largest magnitude at 127 (a zero row: scale 1)."""
    largest = np.abs(rows).max(axis=1)
    scale = np.where(largest > 0, largest / INT8_MAX, 1.0).astype(np.float32)
    quantised = np.clip(np.rint(rows / scale[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return quantised, scale


def quantise_projection(out: Path, int8_graph: Path) -> None:
    """Rewrites `int8_graph` (the dynamic quantisation of decoder.shortlist.onnx) to multiply its projection input
    in int8, with the scales of the int8 rows shortlist_projection.npz in `out` holds (int8_rows of its fp32 rows:
    the same rows, computed again rather than stored twice)."""
    with np.load(out / SHORTLIST_FILES["projection"]) as arrays:
        _, scale = int8_rows(arrays["onnx"])
    model = onnx.load(str(int8_graph))
    rewrite_int8_projection(model.graph, scale)
    onnx.save(model, str(int8_graph))


def rewrite_int8_projection(graph: onnx.GraphProto, scale: np.ndarray) -> None:
    """The fp32 MatMul of the projection input -> DynamicQuantizeMatMul of its int8 columns, times each column's
    scale (gathered by the sentence's shortlist ids); the input becomes int8. ValueError if the graph has no such
    MatMul (the exporter or the quantiser changed what they emit)."""
    position, matmul = next(((i, node) for i, node in enumerate(graph.node)
                             if node.op_type == "MatMul" and list(node.input[1:]) == [SHORTLIST_PROJECTION_INPUT]),
                            (None, None))
    if matmul is None:
        raise ValueError(f"no fp32 MatMul of {SHORTLIST_PROJECTION_INPUT} in the shortlisted decoder to make int8")
    product, by_sentence, by_column = (f"{SHORTLIST_PROJECTION_INPUT}_{name}" for name in
                                       ("unscaled", "scale_by_sentence", "scale_by_column"))
    nodes = [
        helper.make_node("DynamicQuantizeMatMul", [matmul.input[0], SHORTLIST_PROJECTION_INPUT, UNIT_SCALE, ZERO_POINT],
                         [product], domain="com.microsoft"),
        helper.make_node("Gather", [SCALES, SHORTLIST_INPUT], [by_sentence], axis=0),  # (sentences, width)
        helper.make_node("Unsqueeze", [by_sentence, SCALE_AXES], [by_column]),  # (sentences, 1, width)
        helper.make_node("Mul", [product, by_column], list(matmul.output)),
    ]
    graph.node.remove(matmul)
    for offset, node in enumerate(nodes):
        graph.node.insert(position + offset, node)
    graph.initializer.extend([
        numpy_helper.from_array(scale.astype(np.float32), SCALES),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), UNIT_SCALE),
        numpy_helper.from_array(np.array(0, dtype=np.int8), ZERO_POINT),
        numpy_helper.from_array(np.array([1], dtype=np.int64), SCALE_AXES),
    ])
    [projection] = [i for i in graph.input if i.name == SHORTLIST_PROJECTION_INPUT]
    projection.type.tensor_type.elem_type = TensorProto.INT8
