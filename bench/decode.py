"""Benchmark decoding on Multi30k test_2016_flickr (or --split val): `generate`, the ONNX path, CTranslate2.

One direction of the model: its only one, or the one --tgt (and --src) names on a multilingual model; the test
set's files of those two languages are the sources and references, and every path reads each source as the model
was trained to and decodes after the direction's decoder prefix: generate and CTranslate2 frame the sources and
start the translations by the direction's layout in the model's languages.json (a Marian `>>fr<<` tag, an mBART /
M2M-100 / NLLB language code; pipeline/runtime/model_languages.py), the Translator by the export's copy (tgt=, src=).

One trained model, beam 4, 2 threads for every path (torch.set_num_threads; the Translator's batches decoded at
once, one ONNX Runtime thread each; CTranslate2 inter_threads x intra_threads). Each path translates the same
sentences, in the same token-budget batches where it has batches of its own, after a short warm-up; the figures
are wall seconds, sentences/s and target tokens/s (hypotheses re-tokenized with the model's target tokenizer, </s>
included, so every path is counted alike), sacreBLEU (cased, 13a) and, against `generate`, the speed ratio, the
BLEU change and the share of identical hypotheses.

    generate      stages.evaluate.translate: the evaluate stage's batched `model.generate(num_beams=4)`
    onnx          pipeline.runtime.translate.Translator on models/export (encoder + KV-cached decoder, numpy beam
                  search), as `mtpipe translate` runs it: 2 batches at once, one ONNX Runtime thread each
    onnx-1x2      the same graphs, one batch at a time, every op split over 2 intra-op threads (the comparison
                  that chose the layout above)
    onnx-int8     the Translator on the int8 graphs (`mtpipe translate --int8`), when the export has them
    ctranslate2   when the package is installed: the export's ctranslate2/ directory, or a conversion of --model
                  into a temporary directory (--ct2-quantization)

Then the fp32 ONNX path's compute: its FLOPs (counted from the shapes of every encoder and decoder call), the
rate it ran at as a share of an fp32 matmul peak measured in the same run (bench/train_throughput.py's), and the
rate 5x `generate` would need for the same FLOPs.

With --student EXPORT (a distilled student's models/student/export), the student's ONNX graphs decode the same
sentences in the same run (student-onnx, student-int8, and student-int8-shortlist where it has a lexical shortlist,
export.shortlist), and two more goals are printed per student int8 path: at least 3x the teacher's int8
sentences/s (over its whole vocabulary), and BLEU at least the teacher's (`generate`) - 1.0. A teacher export with
a shortlist adds onnx-int8-shortlist. Every other ONNX path ranks the whole vocabulary.

Goals, printed with PASS/MISS and asserted nowhere: the ONNX paths (fp32 and int8, each) at least 5x `generate`;
every path's BLEU within 0.2 of `generate` (the student's aside). A table first, then, as the last line, one JSON
object with every figure.

    .venv/bin/python bench/decode.py                          # models/final + models/export, all 1000 sentences
    .venv/bin/python bench/decode.py --limit 100              # a quick look
    .venv/bin/python bench/decode.py --split val              # Multi30k val: what choices are made on
    .venv/bin/python bench/decode.py --model DIR --export DIR
    .venv/bin/python bench/decode.py --model DIR --export DIR --tgt fr   # one direction of a multilingual model
    .venv/bin/python bench/decode.py --skip onnx-1x2 ctranslate2 --student models/student/export
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
TEST_SET = "test_2016_flickr"
GOAL_ONNX_SPEEDUP = 5.0
GOAL_BLEU_DELTA = 0.2
GOAL_STUDENT_SPEEDUP = 3.0  # the student's int8 against the teacher's int8
GOAL_STUDENT_BLEU_LOSS = 1.0  # the student's BLEU at least the teacher's minus this
STUDENT_PATHS = ("student-onnx", "student-int8", "student-int8-shortlist")
WARMUP_SENTENCES = 8


def read_gz_lines(path: Path, limit: int | None) -> list[str]:
    if not path.is_file():
        sys.exit(f"{path} not found: pass --multi30k DIR (a directory with <split>.<lang>.gz per language)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\r\n") for line in f]
    return lines[:limit] if limit else lines


def timed_rounds(paths: dict[str, Callable[[list[str]], list[str]]], sources: list[str], repeat: int
                 ) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Each path's hypotheses and median wall time over `repeat` rounds, each round decoding the sources once with
    every path in turn: a slower spell of the machine (other tenants, clock changes) falls on every path alike
    instead of on whichever path ran then, and the ratios of one run compare like with like."""
    for name, translate in paths.items():
        print(f"warming up {name} ...", file=sys.stderr, flush=True)
        translate(sources[:WARMUP_SENTENCES])  # first-call costs (allocations, lazy init) are not decoding speed
    hyps: dict[str, list[str]] = {}
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for round_number in range(1, repeat + 1):
        for name, translate in paths.items():
            print(f"round {round_number}/{repeat}: decoding with {name} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            hyps[name] = translate(sources)
            seconds[name].append(time.perf_counter() - start)
    return hyps, {name: statistics.median(times) for name, times in seconds.items()}


# --------------------------------------------------------------------------------------------------- the paths


def generate_path(model_dir: Path, generation: Any, args: argparse.Namespace) -> tuple[Callable, Any]:
    """The evaluate stage's translate, with the export manifest's length rule and length penalty (so every path
    decodes by them), on the sources in the direction's layout (its tag or code, from the model's languages.json)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from pipeline.params import EvaluateParams
    from pipeline.runtime.model_languages import ModelLanguages
    from stages.evaluate import translate

    torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = EvaluateParams(beam=args.beam, max_tokens=args.max_tokens, length_penalty=generation.length_penalty,
                              max_len_a=generation.max_len_a, max_len_b=generation.max_len_b)
    layout = ModelLanguages.read(model_dir).layout(args.direction)
    return (lambda sources: translate(model, tokenizer, layout, sources, settings, progress_bar=False)), tokenizer


class FlopCounter:
    """Forward FLOPs (2 per multiply-add) of every encoder and decoder call the ONNX path makes, counted from the
    shapes it feeds: what the path computes, whatever the search does around it."""

    def __init__(self, model: Any, config: dict[str, Any]):
        self.d, self.ffn, self.vocab = config["d_model"], config["decoder_ffn_dim"], config["vocab_size"]
        self.encoder_layers, self.decoder_layers = config["encoder_layers"], config["decoder_layers"]
        self.flops = 0.0
        lock = threading.Lock()  # the translator decodes batches on several threads
        encode, decode = model.encode, model.decode

        def add(flops: float) -> None:
            with lock:
                self.flops += flops

        def counted_encode(input_ids, attention_mask):
            batch, s = input_ids.shape
            d, f = self.d, self.ffn
            layer = 8 * s * d * d + 4 * s * s * d + 4 * s * d * f  # QKVO, QK^T + AV, feed-forward
            add(batch * (self.encoder_layers * layer + self.decoder_layers * 4 * s * d * d))  # + cross K,V
            return encode(input_ids, attention_mask)

        def counted_decode(decoder_input_ids, encoder_attention_mask, self_cache, cross_cache, logits=True,
                           cache_rows=None):
            rows, new = decoder_input_ids.shape
            past, s = self_cache[0].shape[2], encoder_attention_mask.shape[1]
            d, f = self.d, self.ffn
            layer = 8 * d * d + 4 * d * (past + new) + 4 * d * d + 4 * d * s + 4 * d * f  # self, cross, feed-forward
            add(rows * new * (self.decoder_layers * layer + 2 * d * self.vocab))
            return decode(decoder_input_ids, encoder_attention_mask, self_cache, cross_cache, logits=logits,
                          cache_rows=cache_rows)

        model.encode, model.decode = counted_encode, counted_decode


def onnx_path(export_dir: Path, args: argparse.Namespace, int8: bool, intra_op: bool = False,
              shortlist: bool = False) -> tuple[Callable, FlopCounter]:
    """The Translator as `mtpipe translate` runs it: args.threads batches at once, one ONNX Runtime thread each,
    over the whole vocabulary unless `shortlist` (the export's lexical shortlist). intra_op: one batch at a time,
    each graph op split over args.threads threads (for the comparison)."""
    from pipeline.runtime.translate import OnnxSeq2Seq, Translator

    translator = Translator(export_dir, int8=int8, threads=1 if intra_op else args.threads,
                            max_tokens=args.max_tokens, shortlist=shortlist)
    if intra_op:
        graphs = translator.manifest.onnx_graphs(int8)
        translator.model = OnnxSeq2Seq(export_dir / graphs["encoder"], export_dir / graphs["decoder"], args.threads)
    counter = FlopCounter(translator.model, json.loads((export_dir / "config.json").read_text()))

    def translate(sources: list[str]) -> list[str]:
        counter.flops = 0.0  # so it holds the FLOPs of the last (timed) call
        return translator.translate(sources, beam=args.beam, tgt=args.direction.tgt, src=args.direction.src)

    return translate, counter


def ctranslate2_model(model_dir: Path, export_dir: Path, manifest: Any, quantization: str, workdir: Path
                      ) -> tuple[Path, str]:
    """The export's CTranslate2 model, or model_dir converted into workdir when the export has none; and what it is."""
    from pipeline.runtime.export_format import CTRANSLATE2_DIR
    from stages.export.ctranslate2_model import convert_ctranslate2

    exported = export_dir / CTRANSLATE2_DIR
    if exported.is_dir():
        return exported, f"{exported} ({manifest.parity.get('ctranslate2', {}).get('quantization', '?')})"
    converted = workdir / CTRANSLATE2_DIR
    # The export's converter: it states what a transformers 5 config no longer says (mBART's pre-norm layers).
    convert_ctranslate2(model_dir, converted, quantization)
    return converted, f"converted from {model_dir} ({quantization})"


def ctranslate2_path(model_dir: Path, export_dir: Path, manifest: Any, tokenizer: Any, args: argparse.Namespace,
                     workdir: Path) -> tuple[Callable, str]:
    """CTranslate2 on the export's directory (or a conversion of model_dir), with the manifest's length rule, on
    the sources in the direction's layout, decoding after its decoder prefix as the export's parity check does
    (stages/export/ctranslate2_model.py: target_prefix, starts_itself)."""
    import ctranslate2

    from pipeline.runtime.decoding import output_limit
    from pipeline.runtime.model_languages import ModelLanguages
    from stages.export.ctranslate2_model import prefix_shown, search_options, starts_itself, target_prefix

    ct2_dir, source = ctranslate2_model(model_dir, export_dir, manifest, args.ct2_quantization, workdir)
    # 2 x 1 threads beat 1 x 2 on two cores for small models: batches decode in parallel.
    inter, intra = (2, 1) if args.threads == 2 else (1, args.threads)
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", inter_threads=inter, intra_threads=intra)
    generation, max_positions = manifest.generation, manifest.dims.max_positions
    layout = ModelLanguages.read(model_dir).layout(args.direction)
    own_start = starts_itself(ct2_dir)
    prefix = target_prefix(layout, tokenizer, own_start)
    shown = prefix_shown(prefix, own_start)

    def translate(sources: list[str]) -> list[str]:
        pieces = tokenizer(sources, add_special_tokens=False)["input_ids"]
        tokens = [tokenizer.convert_ids_to_tokens(layout.source(p)) for p in pieces]
        # One limit per call (the longest source's).
        limit = output_limit(max(len(t) for t in tokens), generation.max_len_a, generation.max_len_b, max_positions)
        results = translator.translate_batch(
            tokens, beam_size=args.beam, max_batch_size=max(args.max_tokens // args.beam, 1), batch_type="tokens",
            length_penalty=generation.length_penalty, **search_options(prefix, own_start, limit, len(tokens)),
        )
        # Decoded as the evaluate stage decodes: special tokens (a language code the model wrote) dropped.
        return [tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0][shown:]), skip_special_tokens=True)
                for r in results]

    return translate, f"{source}, inter_threads {inter} x intra_threads {intra}"


# --------------------------------------------------------------------------------------------------- report


def path_figures(hyps: list[str], seconds: float, sources: list[str], refs: list[str], tokenizer: Any
                 ) -> dict[str, Any]:
    """One path's speed and BLEU."""
    import sacrebleu

    target_tokens = sum(len(ids) for ids in tokenizer(text_target=hyps)["input_ids"])
    return {
        "seconds": round(seconds, 2),
        "sentences_per_s": round(len(sources) / seconds, 2),
        "target_tokens_per_s": round(target_tokens / seconds, 1),
        "target_tokens": target_tokens,
        "bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
        "hyps": hyps,
    }


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, n: int, notes: dict[str, str]) -> dict:
    base = results["generate"]
    for r in results.values():
        r["speedup_vs_generate"] = round(r["sentences_per_s"] / base["sentences_per_s"], 2)
        r["bleu_delta_vs_generate"] = round(r["bleu"] - base["bleu"], 2)
        r["identical_to_generate"] = round(sum(a == b for a, b in zip(r["hyps"], base["hyps"], strict=True)) / n, 4)
    print(f"\nMulti30k {args.split} {args.direction}: {n} sentences, beam {args.beam}, {args.threads} threads, "
          f"max_tokens {args.max_tokens}, median of {args.repeat} round(s) over every path")
    header = f"{'path':<12} {'seconds':>8} {'sent/s':>8} {'tgt tok/s':>10} {'x generate':>10} {'BLEU':>6} " \
             f"{'dBLEU':>6} {'identical':>9}"
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        print(f"{name:<12} {r['seconds']:>8.2f} {r['sentences_per_s']:>8.2f} {r['target_tokens_per_s']:>10.1f} "
              f"{r['speedup_vs_generate']:>10.2f} {r['bleu']:>6.2f} {r['bleu_delta_vs_generate']:>+6.2f} "
              f"{r['identical_to_generate']:>9.1%}")
    for name, note in notes.items():
        print(f"  {name}: {note}")
    onnx_paths = [name for name in ("onnx", "onnx-int8") if name in results]
    goals = {f"{name}_at_least_5x_generate": results[name]["speedup_vs_generate"] >= GOAL_ONNX_SPEEDUP
             for name in onnx_paths}
    goals["every_bleu_within_0.2_of_generate"] = all(abs(r["bleu_delta_vs_generate"]) <= GOAL_BLEU_DELTA
                                                     for name, r in results.items() if name not in STUDENT_PATHS)
    print("Goals:")
    for name in onnx_paths:
        print(f"  {name} >= {GOAL_ONNX_SPEEDUP:g}x generate: {results[name]['speedup_vs_generate']:.2f}x "
              f"{'PASS' if goals[f'{name}_at_least_5x_generate'] else 'MISS'}")
    worst = max((r for name, r in results.items() if name not in STUDENT_PATHS),
                key=lambda r: abs(r["bleu_delta_vs_generate"]))
    print(f"  every path's BLEU within {GOAL_BLEU_DELTA} of generate: largest change "
          f"{worst['bleu_delta_vs_generate']:+.2f} {'PASS' if goals['every_bleu_within_0.2_of_generate'] else 'MISS'}")
    if "student-int8" in results and "onnx-int8" in results:
        goals.update(student_goals(results, "student-int8"))
    if "student-int8-shortlist" in results and "onnx-int8" in results:
        goals.update({f"{name}_shortlist": met
                      for name, met in student_goals(results, "student-int8-shortlist").items()})
    for r in results.values():
        del r["hyps"]
    return {"test_set": args.split, "direction": str(args.direction), "sentences": n, "beam": args.beam,
            "threads": args.threads, "max_tokens": args.max_tokens, "repeat": args.repeat, "paths": results,
            "notes": notes, "goals": goals, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}


def student_goals(results: dict[str, dict[str, Any]], path: str) -> dict[str, bool]:
    """The distilled student (`path`: its int8 path, with or without its shortlist) against its teacher's int8
    over the whole vocabulary, both measured above: speed and BLEU."""
    student, teacher_int8, teacher = results[path], results["onnx-int8"], results["generate"]
    speedup = student["sentences_per_s"] / teacher_int8["sentences_per_s"]
    loss = teacher["bleu"] - student["bleu"]
    goals = {"student_int8_at_least_3x_teacher_int8": speedup >= GOAL_STUDENT_SPEEDUP,
             "student_bleu_within_1_of_teacher": loss <= GOAL_STUDENT_BLEU_LOSS}
    print(f"  {path} >= {GOAL_STUDENT_SPEEDUP:g}x teacher int8: {student['sentences_per_s']:.1f} / "
          f"{teacher_int8['sentences_per_s']:.1f} sent/s = {speedup:.2f}x "
          f"{'PASS' if goals['student_int8_at_least_3x_teacher_int8'] else 'MISS'}")
    print(f"  {path} BLEU >= teacher (generate) - {GOAL_STUDENT_BLEU_LOSS:g}: {student['bleu']:.2f} against "
          f"{teacher['bleu']:.2f} ({-loss:+.2f}) {'PASS' if goals['student_bleu_within_1_of_teacher'] else 'MISS'}")
    student["speedup_vs_teacher_int8"] = round(speedup, 2)
    return goals


def compute_bound(flops: float, results: dict[str, dict[str, Any]], threads: int) -> dict[str, float]:
    """How close the fp32 ONNX path runs to the machine's fp32 matmul peak, and the rate `GOAL_ONNX_SPEEDUP` x
    `generate` would need for the same FLOPs: whether the goal is reachable by removing overhead at all."""
    from bench.train_throughput import matmul_peak

    peak = matmul_peak(threads, "fp32")
    achieved = flops / results["onnx"]["seconds"]
    needed = flops / (results["generate"]["seconds"] / GOAL_ONNX_SPEEDUP)
    print(f"\nfp32 ONNX path: {flops / 1e9:.0f} GFLOP of encoder + decoder calls (from their shapes) in "
          f"{results['onnx']['seconds']:.2f} s = {achieved / 1e9:.1f} GFLOP/s, {achieved / peak:.0%} of the fp32 "
          f"matmul peak measured here ({peak / 1e9:.1f} GFLOP/s, {threads} threads); {GOAL_ONNX_SPEEDUP:g}x generate "
          f"would need {needed / 1e9:.1f} GFLOP/s = {needed / peak:.2f}x that peak")
    return {"onnx_gflop": round(flops / 1e9, 1), "onnx_gflops_per_s": round(achieved / 1e9, 1),
            "matmul_peak_gflops_per_s": round(peak / 1e9, 1), "onnx_peak_share": round(achieved / peak, 3),
            "goal_needs_gflops_per_s": round(needed / 1e9, 1), "goal_needs_peak_multiple": round(needed / peak, 2)}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=REPO / "models" / "final",
                        help="trained save_pretrained directory (default: %(default)s)")
    parser.add_argument("--export", type=Path, default=None,
                        help="export directory of the same model (default: models/export beside --model)")
    parser.add_argument("--multi30k", type=Path, default=MULTI30K, help="default: %(default)s")
    parser.add_argument("--split", default=TEST_SET,
                        help="the Multi30k split decoded: test_2016_flickr (reported) or val (tuned on); "
                             "default: %(default)s")
    parser.add_argument("--limit", type=int, default=None, help="first N test sentences only")
    parser.add_argument("--tgt", default=None, help="target language (needed on a model of several)")
    parser.add_argument("--src", default=None, help="source language (needed where several go into --tgt)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=6000,
                        help="rows x longest source per batch, beams included, for every path (default: %(default)s)")
    parser.add_argument("--ct2-quantization", default="int8",
                        help="for a CTranslate2 conversion made here (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds, each decoding with every path in turn; a path's median time counts (default: 1)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["onnx-1x2", "onnx-int8", "ctranslate2"])
    parser.add_argument("--student", type=Path, default=None,
                        help="a distilled student's export directory, measured against this teacher")
    return parser.parse_args()


def teacher_onnx_paths(export_dir: Path, manifest: Any, args: argparse.Namespace
                       ) -> tuple[dict[str, Callable[[list[str]], list[str]]], dict[str, str], Any]:
    """The teacher's ONNX paths, their notes, and the fp32 path's FLOP counter."""
    paths, notes = {}, {}
    paths["onnx"], counter = onnx_path(export_dir, args, int8=False)
    notes["onnx"] = f"{export_dir}, {args.threads} batches at once x 1 ONNX Runtime thread (as mtpipe translate)"
    if "onnx-1x2" not in args.skip and args.threads > 1:
        paths["onnx-1x2"] = onnx_path(export_dir, args, int8=False, intra_op=True)[0]
        notes["onnx-1x2"] = f"the same graphs, 1 batch at a time x {args.threads} intra-op threads"
    if manifest.onnx_graphs(int8=True) is not None and "onnx-int8" not in args.skip:
        paths["onnx-int8"] = onnx_path(export_dir, args, int8=True)[0]
        notes["onnx-int8"] = "int8 graphs (dynamic quantisation), as mtpipe translate --int8 --no-shortlist"
        if manifest.shortlisted_decoder(int8=True) is not None:
            paths["onnx-int8-shortlist"] = onnx_path(export_dir, args, int8=True, shortlist=True)[0]
            notes["onnx-int8-shortlist"] = "int8 graphs with the export's lexical shortlist (export.shortlist)"
    return paths, notes, counter


def student_paths(student_dir: Path, args: argparse.Namespace
                  ) -> tuple[dict[str, Callable[[list[str]], list[str]]], dict[str, str]]:
    """The student's fp32, int8 and (where its export has one) int8 shortlisted paths, and their notes."""
    from pipeline.runtime.export_format import ExportManifest

    paths, notes = {}, {}
    shortlisted = ExportManifest.read(student_dir).shortlisted_decoder(int8=True) is not None
    for name, int8, shortlist in zip(STUDENT_PATHS, (False, True, True), (False, False, True), strict=True):
        if shortlist and not shortlisted:
            continue
        paths[name] = onnx_path(student_dir, args, int8=int8, shortlist=shortlist)[0]
        notes[name] = (f"{student_dir}, {'int8' if int8 else 'fp32'} graphs, "
                       f"{'with its shortlist' if shortlist else 'the whole vocabulary'} (the student)")
    return paths, notes


def main() -> None:
    args = arguments()
    from pipeline.runtime.export_format import MANIFEST, ExportManifest

    export_dir = args.export or args.model.parent / "export"
    for path in (args.model / "config.json", export_dir / MANIFEST):
        if not path.is_file():
            sys.exit(f"{path} not found: train and export a model first (`dvc repro`), or pass --model/--export")

    from pipeline.runtime.languages import UnknownDirection
    from pipeline.runtime.model_languages import ModelLanguages

    manifest = ExportManifest.read(export_dir)
    try:
        # The model's directions are its languages.json's (the export manifest names none since version 7).
        args.direction = ModelLanguages.read(export_dir).directions.find(args.src, args.tgt)
    except UnknownDirection as err:
        sys.exit(f"{export_dir}: {err} (--tgt, --src)")

    sources = read_gz_lines(args.multi30k / f"{args.split}.{args.direction.src}.gz", args.limit)
    refs = read_gz_lines(args.multi30k / f"{args.split}.{args.direction.tgt}.gz", args.limit)
    generate, tokenizer = generate_path(args.model, manifest.generation, args)
    onnx_paths, onnx_notes, counter = teacher_onnx_paths(export_dir, manifest, args)
    paths: dict[str, Callable[[list[str]], list[str]]] = {"generate": generate, **onnx_paths}
    notes = {"generate": f"{args.model}", **onnx_notes}
    import importlib.util

    with tempfile.TemporaryDirectory() as workdir:
        if "ctranslate2" in args.skip:
            notes["ctranslate2"] = "skipped (--skip)"
        elif importlib.util.find_spec("ctranslate2") is None:
            notes["ctranslate2"] = "not installed (pip install 'mtpipe[ct2]'): not measured"
        else:
            paths["ctranslate2"], notes["ctranslate2"] = ctranslate2_path(args.model, export_dir, manifest, tokenizer,
                                                                          args, Path(workdir))
        if args.student is not None:
            more_paths, more_notes = student_paths(args.student, args)
            paths.update(more_paths)
            notes.update(more_notes)
        hyps, seconds = timed_rounds(paths, sources, args.repeat)
    results = {name: path_figures(hyps[name], seconds[name], sources, refs, tokenizer) for name in paths}
    figures = report(results, args, len(sources), notes)
    figures["compute_bound"] = compute_bound(counter.flops, results, args.threads)
    print(json.dumps(figures))

if __name__ == "__main__":
    main()
