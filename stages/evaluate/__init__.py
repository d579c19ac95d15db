"""evaluate: beam search on every test set, scored with sacreBLEU (BLEU, chrF and TER, with their signatures).

The model is loaded from `models/final` with `from_pretrained`, the stage boundary being the standard format,
not the training code. Sentences are batched by tokens (sorted by length, restored to input order), and each
sentence's output length is capped at `max_len_a * source_length + max_len_b` (pipeline.decoding.output_limit, the
fairseq convention; per sentence, so a translation does not depend on its batch, and the same limit
`mtpipe translate` applies). Scores are cased and computed on detokenized text (BLEU with sacreBLEU's default 13a
tokenizer, TER case-sensitive) against the cleaned references.

Writes `metrics/eval.json` as {test_set: {bleu, chrf, ter, signature: {bleu, chrf, ter}, length_ratio, sentences,
seconds}} (so `dvc metrics diff` shows e.g. `test.bleu` old/new/change between two experiments) and, under
`reports/eval/`:
  index.html                 the page to look at (report_html.py): scores, sentence BLEU against source length
                             (length_plot.py), the best and worst sentences; one file that loads nothing
  report.md                  the same scores and sentences in markdown (report_markdown.py), for diffs
  <test_set>.hyp.txt         the hypotheses, one per line, in test-set order
  <test_set>.sentences.tsv   line, src, ref, hyp, sentence_bleu per sentence (sentences.py; tab-separated, csv quoting)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, test_splits, write_json
from pipeline.corpus import read_pairs
from pipeline.decoding import one_line, output_limit, pad_batch, token_batches
from pipeline.errors import MissingArtifact
from pipeline.params import EvaluateParams, Params
from stages.evaluate.report_html import html_report
from stages.evaluate.report_markdown import markdown_report
from stages.evaluate.sentences import ScoredSentence, best_and_worst, score_sentences, write_sentence_table

log = logging.getLogger("mtpipe.evaluate")


def translate(
    model: Any, tokenizer: Any, sentences: list[str], cfg: EvaluateParams, progress_bar: bool = True
) -> list[str]:
    """Beam-search translations in input order; a sentence's translation does not depend on its batch."""
    import torch
    from tqdm import tqdm
    from transformers import LogitsProcessorList

    from stages.evaluate.sentence_limits import ForceEosAtSentenceLimit

    max_positions = model.config.max_position_embeddings
    encoded = tokenizer(sentences, truncation=True, max_length=max_positions).input_ids

    hyps = [""] * len(sentences)
    model.eval()
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    # disable=None: a bar on a terminal only, so a log file (DVC, CI, Prefect) gets no stream of bar updates.
    progress = tqdm(total=len(sentences), desc="translate", unit="sent", mininterval=2,
                    disable=None if progress_bar else True)
    for batch in token_batches([len(e) for e in encoded], cfg.max_tokens // max(cfg.beam, 1)):
        ids, mask = pad_batch([encoded[i] for i in batch], pad)
        limits = [output_limit(len(encoded[i]), cfg.max_len_a, cfg.max_len_b, max_positions) for i in batch]
        with torch.inference_mode():
            out = model.generate(
                input_ids=torch.from_numpy(ids).to(model.device),
                attention_mask=torch.from_numpy(mask).to(model.device),
                num_beams=cfg.beam,
                length_penalty=cfg.length_penalty,
                # max_length counts the decoder start token; it overrides the model's own default.
                max_length=max(limits) + 1,
                logits_processor=LogitsProcessorList([ForceEosAtSentenceLimit(limits, cfg.beam, eos, model.device)]),
                early_stopping=True,
                bad_words_ids=[[pad]],
                do_sample=False,
            )
        for i, text in zip(batch, tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
            hyps[i] = one_line(text)
        progress.update(len(batch))
    progress.close()
    return hyps


def _metrics() -> tuple[Any, Any, Any]:
    from sacrebleu.metrics import BLEU, CHRF, TER

    # TER lowercases by default; case_sensitive keeps all three scores cased.
    return BLEU(), CHRF(), TER(case_sensitive=True)


def score(hyps: list[str], refs: list[str]) -> dict[str, Any]:
    """Corpus BLEU, chrF and TER with their sacreBLEU signatures, and BLEU's length ratio (hypothesis over
    reference length in its tokens: below 1, the brevity penalty applies)."""
    bleu, chrf, ter = _metrics()
    results = {name: metric.corpus_score(hyps, [refs]) for name, metric in
               (("bleu", bleu), ("chrf", chrf), ("ter", ter))}
    return {
        **{name: round(result.score, 2) for name, result in results.items()},
        "signature": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature()),
                      "ter": str(ter.get_signature())},
        "length_ratio": round(results["bleu"].ratio, 3),
    }


def load_model(model_dir: Path) -> tuple[Any, Any]:
    """The trained model (on the GPU when there is one: beam search over a test set is the stage's cost) and its
    tokenizer."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return AutoModelForSeq2SeqLM.from_pretrained(model_dir).to(device), AutoTokenizer.from_pretrained(model_dir)


def run(params: Params, paths: Paths) -> dict[str, Any]:
    if not (paths.final_model / "config.json").exists():
        raise MissingArtifact(paths.final_model, "train")
    model, tokenizer = load_model(paths.final_model)
    results: dict[str, Any] = {}
    tables: dict[str, list[ScoredSentence]] = {}
    with atomic_path(paths.eval_dir) as out:
        out.mkdir()
        for split in test_splits(paths.clean):
            sources, refs = read_pairs(paths.split_file(paths.clean, split))
            start = time.perf_counter()
            hyps = translate(model, tokenizer, sources, params.evaluate)
            seconds = time.perf_counter() - start
            (out / f"{split}.hyp.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            tables[split] = score_sentences(sources, refs, hyps)
            write_sentence_table(out / f"{split}.sentences.tsv", tables[split])
            results[split] = {**score(hyps, refs), "sentences": len(hyps), "seconds": round(seconds, 1)}
            log.info("%s: BLEU %.2f chrF %.2f TER %.2f (%d sentences, %.1fs, beam %d)", split,
                     results[split]["bleu"], results[split]["chrf"], results[split]["ter"], len(hyps), seconds,
                     params.evaluate.beam)
        (out / "report.md").write_text(markdown_report(results, tables, params.evaluate), encoding="utf-8")
        (out / "index.html").write_text(html_report(results, tables, params.evaluate), encoding="utf-8")
    write_json(paths.metrics("eval"), results)
    return {f"{s}_bleu": r["bleu"] for s, r in results.items()}


# The per-sentence helpers are part of the stage's interface (tests, bench/decode.py call them as evaluate.*).
__all__ = ["ScoredSentence", "best_and_worst", "run", "score", "score_sentences", "translate", "write_sentence_table"]
