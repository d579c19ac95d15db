"""Greedy decoding with every runtime against `model.generate`, and how their outputs agree.

Every runtime decodes a batch with the same length limit (one per batch, as generate applies it): the ONNX graphs
through pipeline.beam_search with beam 1, CTranslate2 with beam_size 1. Agreement is the share of token-identical
outputs and the corpus BLEU (sacreBLEU, cased, 13a) against the references, with its delta to PyTorch's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.beam_search import beam_search
from pipeline.decoding import SpecialIds, strip_hypothesis
from pipeline.translate import OnnxSeq2Seq
from stages.export.ctranslate2_model import greedy_ids
from stages.export.graph_diffs import ParityBatch


def pytorch_greedy(model: Any, batch: ParityBatch, limit: int, special_ids: SpecialIds) -> list[list[int]]:
    """`model.generate`'s greedy outputs (ids up to and including </s>), never emitting <pad>."""
    import torch

    with torch.no_grad():
        generated = model.generate(
            input_ids=torch.from_numpy(batch.input_ids),
            attention_mask=torch.from_numpy(batch.attention_mask),
            num_beams=1,
            do_sample=False,
            # max_length counts the start token (max_new_tokens would warn against the saved max_length).
            max_length=limit + 1,
            bad_words_ids=[[special_ids.pad]],
            forced_eos_token_id=special_ids.eos,
            decoder_start_token_id=special_ids.start,
            eos_token_id=special_ids.eos,
            pad_token_id=special_ids.pad,
        )
    return [strip_hypothesis(row[1:].tolist(), special_ids.eos, special_ids.pad) for row in generated]


def greedy_outputs(model: Any, onnx_runtimes: Mapping[str, OnnxSeq2Seq], ctranslate2: Any, tokenizer: Any,
                   batch: ParityBatch, limit: int, special_ids: SpecialIds) -> dict[str, list[list[int]]]:
    """{"pytorch", each ONNX runtime's name, "ctranslate2" (when given): greedy ids of the batch}."""
    outputs = {"pytorch": pytorch_greedy(model, batch, limit, special_ids)}
    for name, runtime in onnx_runtimes.items():
        outputs[name] = beam_search(runtime, batch.input_ids, batch.attention_mask, beam=1,
                                    max_new_tokens=[limit] * len(batch.sources), ids=special_ids)
    if ctranslate2 is not None:
        outputs["ctranslate2"] = greedy_ids(ctranslate2, tokenizer, batch.sources, limit, special_ids.eos)
    return outputs


def agreement(reference: list[list[int]], hyps: list[list[int]], bleu_reference: float,
              decode: Callable[[list[list[int]]], list[str]], references: list[str]) -> dict[str, Any]:
    """How a runtime's greedy outputs compare with PyTorch's: identical share, corpus BLEU and its signed delta
    (how much BLEU the runtime gains (+) or loses (-) against PyTorch)."""
    import sacrebleu

    identical = sum(a == b for a, b in zip(reference, hyps, strict=True))
    bleu = round(sacrebleu.corpus_bleu(decode(hyps), [references]).score, 2)
    return {
        "identical_share": round(identical / len(reference), 4),
        "bleu": bleu,
        "bleu_delta": round(bleu - bleu_reference, 2),
    }


def greedy_report(hyps: dict[str, list[list[int]]], tokenizer: Any, references: list[str], pad_id: int
                  ) -> dict[str, Any]:
    """The gated figures of the fp32 ONNX graphs (identical_share, emitted_pad, bleu with its absolute delta) and
    the reported ones of int8 and CTranslate2 (their `agreement`)."""
    import sacrebleu

    def decode(rows: list[list[int]]) -> list[str]:
        return tokenizer.batch_decode(rows, skip_special_tokens=True)

    report: dict[str, Any] = {}
    pytorch_bleu = round(sacrebleu.corpus_bleu(decode(hyps["pytorch"]), [references]).score, 2)
    if "onnx" in hyps:
        onnx = agreement(hyps["pytorch"], hyps["onnx"], pytorch_bleu, decode, references)
        report["identical_share"] = onnx["identical_share"]
        report["emitted_pad"] = any(pad_id in h for h in hyps["onnx"])
        report["bleu"] = {"pytorch": pytorch_bleu, "onnx": onnx["bleu"],
                          "delta": round(abs(onnx["bleu"] - pytorch_bleu), 2)}
    for name in ("onnx_int8", "ctranslate2"):
        if name in hyps:
            report[name] = agreement(hyps["pytorch"], hyps[name], pytorch_bleu, decode, references)
    return report
