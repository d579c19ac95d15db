"""Greedy decoding with every runtime against `model.generate`, and how their outputs agree.

Every runtime decodes a batch of one direction from that direction's decoder prefix
(pipeline/runtime/model_languages.py), with the same length limit (one per batch, as generate applies it), and returns
what follows the prefix: PyTorch through pipeline/prefixed_generate.py, the ONNX graphs through
pipeline.runtime.beam_search with beam 1, CTranslate2 with beam_size 1 and the prefix as its target_prefix. Agreement is
the share of token-identical outputs and the corpus BLEU (sacreBLEU, cased, 13a) against the references, with its delta
to PyTorch's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.runtime.beam_search import beam_search
from pipeline.runtime.decoding import SpecialIds
from pipeline.runtime.model_languages import DirectionLayout
from pipeline.runtime.translate import OnnxSeq2Seq
from stages.export.ctranslate2_model import greedy_ids, target_prefix
from stages.export.graph_diffs import ParityBatch


@dataclass(frozen=True)
class CTranslate2Runtime:
    """A CTranslate2 translator and whether it puts its own start token in front of the target prefix
    (ctranslate2_model.starts_itself)."""

    translator: Any
    starts_itself: bool


def pytorch_greedy(model: Any, batch: ParityBatch, layout: DirectionLayout, limit: int, special_ids: SpecialIds
                   ) -> list[list[int]]:
    """`model.generate`'s greedy outputs after the decoder prefix (ids up to and including </s>), never emitting
    <pad>, </s> forced at the limit."""
    import torch

    from pipeline.prefixed_generate import generate_from_prefix

    with torch.no_grad():
        return generate_from_prefix(
            model,
            torch.from_numpy(batch.input_ids),
            torch.from_numpy(batch.attention_mask),
            layout.decoder_prefix,
            limit,
            eos_id=special_ids.eos,
            pad_id=special_ids.pad,
            num_beams=1,
            bad_words_ids=[[special_ids.pad]],
            forced_eos_token_id=special_ids.eos,
            eos_token_id=special_ids.eos,
            pad_token_id=special_ids.pad,
        )


def greedy_outputs(model: Any, onnx_runtimes: Mapping[str, OnnxSeq2Seq], ctranslate2: CTranslate2Runtime | None,
                   tokenizer: Any, batch: ParityBatch, layout: DirectionLayout, limit: int, special_ids: SpecialIds
                   ) -> dict[str, list[list[int]]]:
    """{"pytorch", each ONNX runtime's name, "ctranslate2" (when given): greedy ids of the batch after the
    direction's decoder prefix}."""
    outputs = {"pytorch": pytorch_greedy(model, batch, layout, limit, special_ids)}
    for name, runtime in onnx_runtimes.items():
        outputs[name] = beam_search(runtime, batch.input_ids, batch.attention_mask, beam=1,
                                    max_new_tokens=[limit] * len(batch.sources), ids=special_ids,
                                    decoder_prefix=layout.decoder_prefix)
    if ctranslate2 is not None:
        prefix = target_prefix(layout, tokenizer, ctranslate2.starts_itself)
        outputs["ctranslate2"] = greedy_ids(ctranslate2.translator, tokenizer, batch.sources, prefix,
                                            ctranslate2.starts_itself, limit, special_ids.eos)
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
    """The fp32 ONNX graphs' figures (identical_share, emitted_pad, bleu with its absolute delta) and the int8
    graphs' and CTranslate2's (their `agreement`); gate.py says which are gated."""
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
