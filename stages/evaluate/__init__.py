"""evaluate: beam search on every test set of every direction, scored with sacreBLEU (BLEU, chrF and TER, with
their signatures).

The model is loaded from `models/final` with `from_pretrained`, the stage boundary being the standard format,
not the training code; the directions it translates come from the `languages.json` beside it
(pipeline.runtime.languages). A test split may hold rows of several directions (each row carries its languages): they
are scored per direction. Each source is the direction's layout around the text's pieces
(pipeline.runtime.model_languages: the Marian `>>de<<` tag in front when the model has several targets,
mBART-50/M2M-100/NLLB's source code, the </s>), and each translation is generated from the direction's decoder prefix
(pipeline.prefixed_generate: the start token, then the target's code), so a multilingual checkpoint writes the
direction's target language; the hypothesis is what follows the prefix. A direction in a test split that the model does
not translate stops the stage, naming the split and the direction, before anything is decoded.

Sentences are batched by tokens (sorted by length, restored to input order), and each sentence's output length is
capped at `max_len_a * source_length + max_len_b` tokens after the decoder prefix
(pipeline.runtime.decoding.output_limit, the fairseq convention; per sentence, so a translation does not depend on its
batch, and the same limit `mtpipe translate` applies). Scores are cased and computed on detokenized text (BLEU with
sacreBLEU's default 13a tokenizer, TER case-sensitive) against the cleaned references.

Writes `metrics/eval.json` (results.py: {test_set: {direction: {bleu, chrf, ter, signature, length_ratio,
sentences}}, "macro": {bleu, chrf, ter}}, so `dvc metrics diff` shows e.g. `test.en-de.bleu` and `macro.bleu`)
and, under `reports/eval/`, the same for every run of the same model on the same data, byte for byte:
  index.html                           the page to look at (report_html.py): scores, then per test set and
                                       direction sentence BLEU against source length (length_plot.py) and the
                                       best and worst sentences; one file that loads nothing
  report.md                            the same scores and sentences in markdown (report_markdown.py), for diffs
  <test_set>.<direction>.hyp.txt       the hypotheses, one per line, in test-set order
  <test_set>.<direction>.sentences.tsv line, src, ref, hyp, sentence_bleu per sentence (sentences.py;
                                       tab-separated, csv quoting; `line` is the hypothesis file's line)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, read_json, test_splits, write_json
from pipeline.corpus import read_pairs_by_direction
from pipeline.errors import MissingArtifact
from pipeline.params import MACRO, EvaluateParams, Params
from pipeline.run_figures import training_run
from pipeline.runtime.decoding import one_line, output_limit, pad_batch, token_batches
from pipeline.runtime.errors import PipelineError
from pipeline.runtime.languages import Direction, Directions
from pipeline.runtime.model_languages import DirectionLayout, ModelLanguages
from stages.evaluate.report_html import html_report
from stages.evaluate.report_markdown import markdown_report
from stages.evaluate.results import AVERAGED, DirectionResult, eval_json
from stages.evaluate.sentences import (
    ScoredSentence,
    best_and_worst,
    score_sentences,
    write_hypotheses,
    write_sentence_table,
)

log = logging.getLogger("mtpipe.evaluate")


def translate(
    model: Any, tokenizer: Any, layout: DirectionLayout, sentences: list[str], cfg: EvaluateParams,
    progress_bar: bool = True,
) -> list[str]:
    """Beam-search translations of one direction's untagged `sentences`, in input order; a sentence's translation
    does not depend on its batch."""
    import torch
    from tqdm import tqdm

    from pipeline.prefixed_generate import generate_from_prefix

    max_positions = model.config.max_position_embeddings
    # The pieces alone (no special ids): the layout puts the direction's own around them, the way the tokenizer
    # does with src_lang set (or with the Marian tag in front). A long source keeps its framing and loses pieces.
    framing = len(layout.source_prefix) + len(layout.source_suffix)
    pieces = tokenizer(sentences, add_special_tokens=False).input_ids
    encoded = [layout.source(p[: max_positions - framing]) for p in pieces]

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
            out = generate_from_prefix(
                model,
                torch.from_numpy(ids).to(model.device),
                torch.from_numpy(mask).to(model.device),
                layout.decoder_prefix,
                limits,
                eos_id=eos,
                pad_id=pad,
                num_beams=cfg.beam,
                length_penalty=cfg.length_penalty,
                early_stopping=True,
                bad_words_ids=[[pad]],
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


class UntranslatedDirection(PipelineError):
    """A test split holds a direction the model does not translate."""


# direction -> (sources, references) of one test split
PairsByDirection = dict[Direction, tuple[list[str], list[str]]]


def read_test_sets(paths: Paths, directions: Directions) -> dict[str, PairsByDirection]:
    """Every test split's pairs grouped by direction, in the model's order of directions; UntranslatedDirection
    for a direction the model does not translate, raised before anything is decoded."""
    test_sets: dict[str, PairsByDirection] = {}
    for split in test_splits(paths.clean):
        path = paths.split_file(paths.clean, split)
        grouped = read_pairs_by_direction(path)
        unknown = [name for name in grouped if name not in directions.names]
        if unknown:
            rows = ", ".join(f"{name} ({len(grouped[name][0])} rows)" for name in unknown)
            raise UntranslatedDirection(f"{path}: test split {split!r} holds {rows}, which {paths.final_model} does "
                                        f"not translate; its directions: {', '.join(directions.names)}")
        test_sets[split] = {d: grouped[str(d)][1:] for d in directions.directions if str(d) in grouped}
    return test_sets


def evaluate_direction(model: Any, tokenizer: Any, layout: DirectionLayout, test_set: str, direction: Direction,
                       pairs: tuple[list[str], list[str]], cfg: EvaluateParams) -> DirectionResult:
    """Translate one direction of one test set (in the direction's layout) and score it."""
    sources, refs = pairs
    start = time.perf_counter()
    hyps = translate(model, tokenizer, layout, sources, cfg)
    seconds = time.perf_counter() - start
    result = DirectionResult(test_set, str(direction), {**score(hyps, refs), "sentences": len(hyps)},
                             score_sentences(sources, refs, hyps))
    log.info("%s %s: BLEU %.2f chrF %.2f TER %.2f (%d sentences, %.1fs, beam %d)", test_set, direction,
             result.scores["bleu"], result.scores["chrf"], result.scores["ter"], len(hyps), seconds, cfg.beam)
    return result


def training_cut_short(paths: Paths) -> str | None:
    """The sentence that opens the reports when a time limit ended training before its planned steps."""
    run = training_run(paths)
    return run.cut_short if run is not None else None


def teacher_scores(paths: Paths) -> dict[tuple[str, str], dict[str, float]]:
    """A student's teacher's BLEU, chrF and TER per (test set, direction), from metrics/eval.json; {} for the
    teacher itself. The student is scored on the same test sets (stages/distill links them)."""
    if not paths.role:
        return {}
    teacher_eval = paths.teacher().metrics("eval")
    if not teacher_eval.is_file():
        raise MissingArtifact(teacher_eval, "evaluate")
    content = read_json(teacher_eval)
    return {(test_set, direction): {key: scores[key] for key in AVERAGED}
            for test_set, entries in content.items() if test_set != MACRO
            for direction, scores in entries.items()}


def run(params: Params, paths: Paths) -> dict[str, Any]:
    if not (paths.final_model / "config.json").exists():
        raise MissingArtifact(paths.final_model, "train")
    teacher = teacher_scores(paths)
    languages = ModelLanguages.read(paths.final_model)
    test_sets = read_test_sets(paths, languages.directions)
    model, tokenizer = load_model(paths.final_model)
    results: list[DirectionResult] = []
    with atomic_path(paths.eval_dir) as out:
        out.mkdir()
        for split, by_direction in test_sets.items():
            for direction, pairs in by_direction.items():
                result = evaluate_direction(model, tokenizer, languages.layout(direction), split, direction, pairs,
                                            params.evaluate)
                if (split, str(direction)) in teacher:  # a student's: its teacher's scores beside its own
                    result.scores["teacher"] = teacher[split, str(direction)]
                write_hypotheses(out / f"{result.name}.hyp.txt", [s.hyp for s in result.sentences])
                write_sentence_table(out / f"{result.name}.sentences.tsv", result.sentences)
                results.append(result)
        metrics = eval_json(results)
        warning = training_cut_short(paths)
        (out / "report.md").write_text(markdown_report(results, params.evaluate, warning), encoding="utf-8")
        (out / "index.html").write_text(html_report(results, params.evaluate, warning), encoding="utf-8")
    write_json(paths.metrics("eval"), metrics)
    return {**{f"{r.name}.bleu": r.scores["bleu"] for r in results},
            **{f"{MACRO}.{key}": value for key, value in metrics.get(MACRO, {}).items()}}


# The per-sentence helpers are part of the stage's interface (tests, bench/decode.py call them as evaluate.*).
__all__ = ["DirectionResult", "ScoredSentence", "UntranslatedDirection", "best_and_worst", "run", "score",
           "score_sentences", "translate", "write_sentence_table"]
