"""evaluate: beam search on every test set, scored with sacreBLEU (BLEU, chrF and TER, with their signatures).

The model is loaded from `models/final` with `from_pretrained`, the stage boundary being the standard format,
not the training code. Sentences are batched by tokens (sorted by length, restored to input order), and each
sentence's output length is capped at `max_len_a * source_length + max_len_b` (the fairseq convention; per sentence,
so a translation does not depend on its batch, and the same limit `mtpipe translate` applies). Scores are cased
and computed on detokenized text (BLEU with sacreBLEU's default 13a tokenizer, TER case-sensitive) against the
cleaned references.

Writes `metrics/eval.json` as {test_set: {bleu, chrf, ter, signature: {bleu, chrf, ter}, sentences, seconds}}
(so `dvc metrics diff` shows e.g. `test.bleu` old/new/change between two experiments) and, under `reports/eval/`:
  <test_set>.hyp.txt         the hypotheses, one per line, in test-set order
  <test_set>.sentences.tsv   line, src, ref, hyp, sentence_bleu per sentence (tab-separated, csv quoting)
  report.md                  the scores and, per test set, the best and worst sentences by sentence BLEU
"""

from __future__ import annotations

import csv
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, test_splits, write_json
from pipeline.corpus import read_pairs
from pipeline.errors import MissingArtifact
from pipeline.params import EvaluateParams, Params
from pipeline.translate import pad_batch, token_batches

log = logging.getLogger("mtpipe.evaluate")


def max_new_tokens(cfg: EvaluateParams, source_length: int, max_positions: int) -> int:
    """max_len_a * source_length + max_len_b (source length counting </s>), within the decoder's positions."""
    return max(1, min(int(cfg.max_len_a * source_length + cfg.max_len_b), max_positions - 1))


def _force_eos_at_sentence_limits(limits: list[int], beam: int, eos_id: int) -> Any:
    """A logits processor that allows only </s> (log p 0) at each sentence's own length limit.

    transformers' `max_length` is one limit for the whole batch, which would make a sentence's translation depend on
    the longest sentence batched with it. This applies the per-sentence limit the same way transformers' forced-EOS
    processor applies max_length, so the batch-wide limit never binds. Rows are sentence * beam + b, as generate
    expands them.
    """
    import torch
    from transformers import LogitsProcessor

    class ForceEosAtSentenceLimit(LogitsProcessor):
        def __init__(self) -> None:
            self.limits = torch.tensor(limits).repeat_interleave(beam)

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            # input_ids holds the start token and the tokens so far: this step makes token number input_ids.shape[1].
            at_limit = self.limits <= input_ids.shape[1]
            if not bool(at_limit.any()):
                return scores
            scores = scores.clone()
            scores[at_limit] = -float("inf")
            scores[at_limit, eos_id] = 0.0
            return scores

    return ForceEosAtSentenceLimit()


def translate(
    model: Any, tokenizer: Any, sentences: list[str], cfg: EvaluateParams, progress_bar: bool = True
) -> list[str]:
    """Beam-search translations in input order; a sentence's translation does not depend on its batch."""
    import torch
    from transformers import LogitsProcessorList

    max_positions = model.config.max_position_embeddings
    encoded = tokenizer(sentences, truncation=True, max_length=max_positions).input_ids
    from tqdm import tqdm

    hyps = [""] * len(sentences)
    model.eval()
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    progress = tqdm(total=len(sentences), desc="translate", unit="sent", mininterval=2, disable=not progress_bar)
    for batch in token_batches([len(e) for e in encoded], cfg.max_tokens // max(cfg.beam, 1)):
        ids, mask = pad_batch([encoded[i] for i in batch], pad)
        limits = [max_new_tokens(cfg, len(encoded[i]), max_positions) for i in batch]
        with torch.inference_mode():
            out = model.generate(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                num_beams=cfg.beam,
                length_penalty=cfg.length_penalty,
                # max_length counts the decoder start token; it overrides the model's own default.
                max_length=max(limits) + 1,
                logits_processor=LogitsProcessorList([_force_eos_at_sentence_limits(limits, cfg.beam, eos)]),
                early_stopping=True,
                bad_words_ids=[[pad]],
                do_sample=False,
            )
        for i, text in zip(batch, tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
            # A byte-fallback piece can decode to a line break; a hypothesis must stay one line.
            hyps[i] = " ".join(text.splitlines())
        progress.update(len(batch))
    progress.close()
    return hyps


def _metrics() -> tuple[Any, Any, Any]:
    from sacrebleu.metrics import BLEU, CHRF, TER

    # TER lowercases by default; case_sensitive keeps all three scores cased.
    return BLEU(), CHRF(), TER(case_sensitive=True)


def score(hyps: list[str], refs: list[str]) -> dict[str, Any]:
    """Corpus BLEU, chrF and TER with their sacreBLEU signatures."""
    bleu, chrf, ter = _metrics()
    scores = {name: metric.corpus_score(hyps, [refs]).score for name, metric in
              (("bleu", bleu), ("chrf", chrf), ("ter", ter))}
    return {
        **{name: round(value, 2) for name, value in scores.items()},
        "signature": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature()),
                      "ter": str(ter.get_signature())},
    }


@dataclass(frozen=True)
class ScoredSentence:
    line: int  # 1-based position in the test set
    src: str
    ref: str
    hyp: str
    sentence_bleu: float


TABLE_COLUMNS = ("line", "src", "ref", "hyp", "sentence_bleu")


def score_sentences(sources: list[str], refs: list[str], hyps: list[str]) -> list[ScoredSentence]:
    """Sentence BLEU per pair (sacreBLEU with effective order, as sentence-level BLEU needs)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True)
    return [
        ScoredSentence(i, src, ref, hyp, round(bleu.sentence_score(hyp, [ref]).score, 2))
        for i, (src, ref, hyp) in enumerate(zip(sources, refs, hyps, strict=True), start=1)
    ]


def write_sentence_table(path: Path, rows: list[ScoredSentence]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(TABLE_COLUMNS)
        writer.writerows((r.line, r.src, r.ref, r.hyp, f"{r.sentence_bleu:.2f}") for r in rows)


def best_and_worst(rows: list[ScoredSentence], n: int) -> tuple[list[ScoredSentence], list[ScoredSentence]]:
    """The n highest and n lowest by sentence BLEU; ties go to the earlier line, so the report is stable."""
    best = sorted(rows, key=lambda r: (-r.sentence_bleu, r.line))[:n]
    worst = sorted(rows, key=lambda r: (r.sentence_bleu, r.line))[:n]
    return best, worst


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ") or " "


def _sentence_rows(rows: list[ScoredSentence]) -> list[str]:
    lines = ["| line | BLEU | source | reference | hypothesis |", "|---:|---:|---|---|---|"]
    lines += [f"| {r.line} | {r.sentence_bleu:.1f} | {_cell(r.src)} | {_cell(r.ref)} | {_cell(r.hyp)} |" for r in rows]
    return lines


def markdown_report(results: dict[str, Any], tables: dict[str, list[ScoredSentence]], cfg: EvaluateParams) -> str:
    lines = [
        "# Evaluation",
        "",
        f"Beam {cfg.beam}, length penalty {cfg.length_penalty}, maximum length {cfg.max_len_a} x source + "
        f"{cfg.max_len_b} tokens. Scores are cased, on detokenized text.",
        "",
        "| test set | sentences | BLEU | chrF | TER |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {split} | {r['sentences']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['ter']:.2f} |"
              for split, r in results.items()]
    if results:
        signature = next(iter(results.values()))["signature"]
        lines += ["", *(f"- {name} signature: `{sig}`" for name, sig in signature.items())]
    for split, rows in tables.items():
        if not rows or cfg.report_sentences == 0:
            continue
        best, worst = best_and_worst(rows, cfg.report_sentences)
        lines += ["", f"## {split}", "", f"Best {len(best)} by sentence BLEU:", "", *_sentence_rows(best)]
        lines += ["", f"Worst {len(worst)} by sentence BLEU:", "", *_sentence_rows(worst)]
    return "\n".join(lines) + "\n"


def load_model(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


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
    write_json(paths.metrics("eval"), results)
    return {f"{s}_bleu": r["bleu"] for s, r in results.items()}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "evaluate")
