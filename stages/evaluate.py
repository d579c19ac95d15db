"""evaluate: beam search on every test set, scored with sacreBLEU (BLEU and chrF, with their signatures).

The model is loaded from `models/final` with `from_pretrained`, the stage boundary being the standard format,
not the training code. Sentences are batched by tokens (sorted by length, restored to input order), and the
output length is capped at `max_len_a * source_length + max_len_b` (the fairseq convention). Scores are cased
and detokenized (sacreBLEU's default 13a tokenizer) against the cleaned references.
Writes `metrics/eval.json` as {test_set: {bleu, chrf, signature: {bleu, chrf}}} and one hypothesis file per
test set under `reports/eval/`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pipeline.artifacts import Paths, atomic_path, test_splits, write_json
from pipeline.corpus import read_pairs
from pipeline.errors import MissingArtifact
from pipeline.params import EvaluateParams, Params

log = logging.getLogger("mtpipe.evaluate")


def token_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length and grouped so rows x longest stays within max_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * max(lengths[i], 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def translate(
    model: Any, tokenizer: Any, sentences: list[str], cfg: EvaluateParams, progress_bar: bool = True
) -> list[str]:
    """Beam-search translations in input order."""
    import torch

    encoded = tokenizer(sentences, truncation=True, max_length=model.config.max_position_embeddings).input_ids
    from tqdm import tqdm

    hyps = [""] * len(sentences)
    model.eval()
    progress = tqdm(total=len(sentences), desc="translate", unit="sent", mininterval=2, disable=not progress_bar)
    for batch in token_batches([len(e) for e in encoded], cfg.max_tokens // max(cfg.beam, 1)):
        ids = [encoded[i] for i in batch]
        longest = max(len(x) for x in ids)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([x + [pad] * (longest - len(x)) for x in ids])
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=(input_ids != pad).long(),
                num_beams=cfg.beam,
                length_penalty=cfg.length_penalty,
                # max_length counts the decoder start token; it overrides the model's own default.
                max_length=int(cfg.max_len_a * longest + cfg.max_len_b) + 1,
                early_stopping=True,
                bad_words_ids=[[pad]],
                do_sample=False,
            )
        for i, text in zip(batch, tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
            hyps[i] = text
        progress.update(len(batch))
    progress.close()
    return hyps


def score(hyps: list[str], refs: list[str]) -> dict[str, Any]:
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "signature": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())},
    }


def load_model(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


def run(params: Params, paths: Paths) -> dict[str, Any]:
    if not (paths.final_model / "config.json").exists():
        raise MissingArtifact(paths.final_model, "train")
    model, tokenizer = load_model(paths.final_model)
    results: dict[str, Any] = {}
    with atomic_path(paths.eval_dir) as out:
        out.mkdir()
        for split in test_splits(paths.clean):
            sources, refs = read_pairs(paths.split_file(paths.clean, split))
            start = time.perf_counter()
            hyps = translate(model, tokenizer, sources, params.evaluate)
            seconds = time.perf_counter() - start
            (out / f"{split}.hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
            results[split] = {**score(hyps, refs), "sentences": len(hyps), "seconds": round(seconds, 1)}
            log.info("%s: BLEU %.2f chrF %.2f (%d sentences, %.1fs, beam %d)", split, results[split]["bleu"],
                     results[split]["chrf"], len(hyps), seconds, params.evaluate.beam)
    write_json(paths.metrics("eval"), results)
    return {f"{s}_bleu": r["bleu"] for s, r in results.items()}


if __name__ == "__main__":
    from pipeline.stage import main

    main(run, "evaluate")
