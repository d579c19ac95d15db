"""The lexical shortlist an export decodes with (`export.shortlist`; the file and how it is read:
pipeline/runtime/shortlist.py), built from the model's own training pairs in its own tokens.

p(target id | source id) comes from IBM Model 1 (Brown et al. 1993): a few EM passes over every (source id, target
id) pair of each sentence pair, with a NULL source for target tokens that translate nothing. Model 1 is the start of
the aligners mozilla/translations' shortlists come from (eflomal, fast_align): its lexical table is what a shortlist
needs, and over a corpus's distinct pairs it is a few seconds of numpy, with no aligner to build. A source id's
candidates are its `per_source` likeliest target ids; every sentence may also use the `frequent` most frequent target
ids and </s>. The student's training pairs are the teacher's translations, so its shortlist holds the tokens the
teacher translates each source token with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifacts import Paths
from pipeline.corpus import read_pairs_by_direction
from pipeline.errors import MissingArtifact
from pipeline.params import ExportParams
from pipeline.runtime.beam_search import beam_search
from pipeline.runtime.decoding import SpecialIds, limit_after_prefix, pad_batch
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.export_format import SHORTLIST_FILES, Generation
from pipeline.runtime.shortlist import Shortlist, read_projection
from pipeline.runtime.translate import BatchShortlist, OnnxSeq2Seq
from stages.export.parity import ORT_THREADS, PARITY_BATCH
from stages.export.stage_inputs import ParityPairs

log = logging.getLogger("mtpipe.export")

EM_ITERATIONS = 5


def lexical_table(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], source_vocab: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IBM Model 1's t(target | source) over the distinct (source id, target id) pairs of the corpus, as (source,
    target, probability) arrays; source id `source_vocab` is NULL.

    Each E-step shares every target token among its sentence's source tokens (and NULL) by t; each M-step
    renormalises the shared counts per source id."""
    null = source_vocab
    pair_source, pair_target, pair_token = [], [], []
    token = 0
    for source, target in zip(sources, targets, strict=True):
        with_null = np.asarray([*source, null], dtype=np.int64)
        target = np.asarray(target, dtype=np.int64)
        pair_source.append(np.tile(with_null, target.size))
        pair_target.append(np.repeat(target, with_null.size))
        pair_token.append(np.repeat(np.arange(token, token + target.size), with_null.size))
        token += target.size
    if not token:
        raise ValueError("no target tokens to build a shortlist from")
    src, tgt, tok = (np.concatenate(parts) for parts in (pair_source, pair_target, pair_token))
    # One row per distinct (source, target) pair; every occurrence points at its row.
    target_span = int(tgt.max()) + 1
    distinct, occurrence = np.unique(src * target_span + tgt, return_inverse=True)
    pair_src, pair_tgt = distinct // target_span, distinct % target_span
    prob = np.ones(distinct.size)
    for _ in range(EM_ITERATIONS):
        share = prob[occurrence]
        share /= np.bincount(tok, weights=share, minlength=token)[tok]
        counts = np.bincount(occurrence, weights=share, minlength=distinct.size)
        prob = counts / np.bincount(pair_src, weights=counts, minlength=null + 1)[pair_src]
    return pair_src, pair_tgt, prob


def build_shortlist(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], source_vocab: int,
                    per_source: int, frequent: int, eos_id: int) -> Shortlist:
    """The shortlist of a corpus given as plain source and target ids (no special tokens): each source id's
    `per_source` likeliest target ids under Model 1, and the `frequent` most frequent target ids with </s>."""
    pair_src, pair_tgt, prob = lexical_table(sources, targets, source_vocab)
    real = pair_src < source_vocab
    pair_src, pair_tgt, prob = pair_src[real], pair_tgt[real], prob[real]
    # By source, likeliest first (ties: the lower id), then each source's first per_source.
    order = np.lexsort((pair_tgt, -prob, pair_src))
    pair_src, pair_tgt = pair_src[order], pair_tgt[order]
    starts = np.searchsorted(pair_src, pair_src, side="left")
    rank = np.arange(pair_src.size) - starts
    keep = rank < per_source
    by_source = np.full((source_vocab, per_source), -1, dtype=np.int64)
    by_source[pair_src[keep], rank[keep]] = pair_tgt[keep]
    counts = np.bincount(np.concatenate([np.asarray(t, dtype=np.int64) for t in targets]))
    by_count = np.argsort(-counts, kind="stable")
    common = by_count[: frequent][counts[by_count[: frequent]] > 0]
    always = np.union1d(common, [eos_id])
    return Shortlist(by_source=by_source, always=always)


def training_pairs(paths: Paths, tokenizer: Any) -> tuple[list[list[int]], list[list[int]]]:
    """Every direction's training pairs of `paths.clean` as the model's plain source and target ids (no special
    tokens), pooled: a model of several directions gets one shortlist."""
    train = paths.split_file(paths.clean, "train")
    if not train.is_file():
        raise MissingArtifact(train, "clean")
    sources: list[list[int]] = []
    targets: list[list[int]] = []
    for _, source_texts, target_texts in read_pairs_by_direction(train).values():
        sources += tokenizer(list(source_texts), add_special_tokens=False)["input_ids"]
        targets += tokenizer(text_target=list(target_texts), add_special_tokens=False)["input_ids"]
    if not any(targets):
        raise PipelineError(f"{train}: no training pairs with target tokens to build the shortlist from "
                            "(export.shortlist: true)")
    return sources, targets


def write_shortlist(paths: Paths, tokenizer: Any, settings: ExportParams, vocab_size: int, eos_id: int,
                    out: Path) -> tuple[Shortlist, dict[str, Any]]:
    """shortlist.npz in `out` from the training pairs; returns it and its figures."""
    start = time.perf_counter()
    sources, targets = training_pairs(paths, tokenizer)
    shortlist = build_shortlist(sources, targets, vocab_size, settings.shortlist_per_source,
                                settings.shortlist_frequent, eos_id)
    shortlist.write(out / SHORTLIST_FILES["table"])
    seconds = round(time.perf_counter() - start, 2)
    log.info("shortlist: %d candidates per source token at most, %d always, from %d training pairs (%.1f s)",
             settings.shortlist_per_source, shortlist.always.size, len(sources), seconds)
    return shortlist, {"per_source": settings.shortlist_per_source, "always": int(shortlist.always.size),
                       "training_pairs": len(sources), "build_seconds": seconds}


def _beam_outputs(runtime: OnnxSeq2Seq, pairs: ParityPairs, generation: Generation, special_ids: SpecialIds,
                  max_positions: int) -> list[list[int]]:
    """The beam search's best hypothesis per parity source."""
    hyps: list[list[int]] = []
    prefix = pairs.layout.decoder_prefix
    for start in range(0, len(pairs.sources), PARITY_BATCH):
        rows = pairs.sources[start : start + PARITY_BATCH]
        input_ids, attention_mask = pad_batch(rows, special_ids.pad)
        limits = [limit_after_prefix(len(r), generation.max_len_a, generation.max_len_b, max_positions, len(prefix))
                  for r in rows]
        hyps += beam_search(runtime, input_ids, attention_mask, beam=generation.beam, max_new_tokens=limits,
                            ids=special_ids, length_penalty=generation.length_penalty, decoder_prefix=prefix)
    return hyps


def _widths(table: Shortlist, pad_id: int, pairs: Mapping[str, ParityPairs]) -> list[int]:
    """Each parity source's shortlist width."""
    widths: list[int] = []
    for direction_pairs in pairs.values():
        ids, mask = pad_batch(direction_pairs.sources, pad_id)
        rows = table.for_batch(ids, mask, pad_id, 1)
        widths += (rows != pad_id).sum(axis=1).tolist()
    return widths


def shortlist_agreement(table: Shortlist, out: Path, files: dict[str, Any], generation: Generation,
                        special_ids: SpecialIds, pairs: Mapping[str, ParityPairs], tokenizer: Any, max_positions: int
                        ) -> dict[str, Any]:
    """Per ONNX precision exported, the shortlisted decoder's beam search (the manifest's beam) against the full
    decoder's on every direction's parity sentences: identical share and corpus BLEU of both; and the sentences'
    mean shortlist width. Reported, not gated: a shortlist trades BLEU for speed, as int8 does."""
    import sacrebleu

    references = [r for p in pairs.values() for r in p.references]
    report: dict[str, Any] = {}
    for precision in ("onnx", "onnx_int8"):
        if precision not in files:
            continue
        graphs = files[precision]
        shortlist = BatchShortlist(table, special_ids.pad,
                                   read_projection(out / files["shortlist"]["projection"], precision))
        full = OnnxSeq2Seq(out / graphs["encoder"], out / graphs["decoder"], ORT_THREADS)
        shortlisted = OnnxSeq2Seq(out / graphs["encoder"], out / files["shortlist"][precision], ORT_THREADS,
                                  shortlist=shortlist)
        full_hyps = [h for p in pairs.values() for h in _beam_outputs(full, p, generation, special_ids,
                                                                          max_positions)]
        shortlisted_hyps = [h for p in pairs.values() for h in _beam_outputs(shortlisted, p, generation,
                                                                             special_ids, max_positions)]
        bleu_full, bleu = (round(sacrebleu.corpus_bleu(tokenizer.batch_decode(h, skip_special_tokens=True),
                                                       [references]).score, 2)
                           for h in (full_hyps, shortlisted_hyps))
        report[precision] = {
            "identical_share": round(sum(a == b for a, b in zip(full_hyps, shortlisted_hyps, strict=True))
                                     / len(full_hyps), 4),
            "bleu_full": bleu_full,
            "bleu": bleu,
            "bleu_delta": round(bleu - bleu_full, 2),
        }
    report["mean_width"] = round(float(np.mean(_widths(table, special_ids.pad, pairs))), 1)
    return report
