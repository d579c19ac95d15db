"""The shortlisted decoder's projection (stages/export/wrappers.ShortlistedDecoder, stages/export/shortlist_projection):
a row's log-probabilities are the full decoder's logits of its sentence's shortlist, <pad> left out, normalised over
them, for a Marian model with and without an output bias; the int8 rows and the rewrite of the int8 graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from pipeline.runtime.shortlist import projection_columns
from stages.export.shortlist_projection import int8_rows, rewrite_int8_projection
from stages.export.wrappers import export_wrappers, shortlisted_decoder
from tests.support.tiny_models import MARIAN_EOS, MARIAN_PAD, tiny_marian

PAD, EOS = MARIAN_PAD, MARIAN_EOS


@pytest.mark.parametrize("bias", [False, True])
def test_a_row_is_ranked_over_its_sentences_shortlist_normalised_there(bias):
    model = tiny_marian(bias, decoder_layers=2).eval()
    encoder, full = export_wrappers(model, beam=4)
    shortlisted = shortlisted_decoder(model, beam=4)
    assert (shortlisted.final_logits_bias is not None) == bias
    input_ids = torch.tensor([[7, 8, 9, EOS], [10, 11, EOS, PAD]])
    mask = (input_ids != PAD).long()
    # Two sentences of 3 hypotheses each, one step after a 2-token prefix.
    decoder_input_ids = torch.tensor([[PAD, 5], [PAD, 6], [PAD, 7], [PAD, 8], [PAD, 9], [PAD, 10]])
    cache_rows = torch.arange(6)
    empty = [torch.zeros(6, 2, 0, 8) for _ in range(4)]
    shortlists = np.array([[0, 4, 9, 12, 20, 33, 40, 41, 50, 52, 58, PAD, PAD],
                           [0, 5, 6, 7, 8, 9, 10, 11, 14, 17, 18, 19, PAD]])  # <pad> listed too: never ranked
    columns = torch.from_numpy(projection_columns(model.lm_head.weight.detach().numpy(), shortlists))
    with torch.no_grad():
        _, *cross = encoder(input_ids, mask)
        logits, *_ = full(decoder_input_ids, mask, cache_rows, empty, cross)
        log_probs, ids, *_ = shortlisted(decoder_input_ids, mask, cache_rows, torch.from_numpy(shortlists), columns,
                                         empty, cross)
    for row in range(6):
        listed = [i for i in shortlists[row // 3] if i != PAD]
        expected = torch.log_softmax(logits[row, -1, listed], dim=-1)
        best = torch.topk(expected, 9)
        assert ids[row].tolist() == [listed[i] for i in best.indices.tolist()]
        torch.testing.assert_close(log_probs[row], best.values, rtol=1e-5, atol=1e-5)


def test_int8_rows_are_within_half_a_step_of_the_weights():
    rows = np.random.default_rng(0).standard_normal((50, 24)).astype(np.float32)
    rows[7] = 0.0
    quantised, scale = int8_rows(rows)
    assert quantised.dtype == np.int8 and scale.shape == (50,) and scale[7] == 1.0
    assert np.abs(quantised).max() == 127
    assert np.all(np.abs(quantised * scale[:, None] - rows) <= scale[:, None] / 2 + 1e-7)


def test_the_rewrite_names_what_it_did_not_find():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    with pytest.raises(ValueError, match="no fp32 MatMul of shortlist_projection"):
        rewrite_int8_projection(graph, np.ones(4, dtype=np.float32))
    assert [node.op_type for node in graph.node] == ["MatMul"]
    onnx.checker.check_graph(graph)
