"""Benchmark: how many checkpoints to average, chosen on a split that is not the test set.

    .venv/bin/python bench/averaging.py --run DIR [--last 1 5 10 20] [--split val] [--threads 2]
        [--directions en-de] [--length-penalty 1.3] [--beam 6] [--until 5300] [--hyp-dir OUT] [--lowercased-tokenized]

DIR is a project directory after `dvc repro` (or `dvc repro evaluate`) with `train.average_last` at least the
largest K asked for: its models/checkpoints/average/ holds the weights of the last updates (one every
`train.save_every`, plus the final one), models/final the config and tokenizer, data/clean/<split>.parquet the
pairs. For each K, the element-wise mean of the last K snapshots (the training stage's own average_snapshots, so
K = train.average_last gives models/final's weights) is put into the model and every direction of the split is
translated with the evaluate stage's beam search and settings (DIR/params.yaml's `evaluate:` block) and scored
with sacreBLEU, as the evaluate stage scores it. A run of one `average_last` thus answers for every smaller K:
averaging is not part of the training trajectory. `--length-penalty` and `--beam` decode with another
`evaluate.length_penalty` or `evaluate.beam` (the decoding choices, made on val too); `--directions` scores only those;
`--hyp-dir` also writes each translation as OUT/<split>.<direction>.last<K>.hyp.txt, one line a sentence as the
evaluate stage's reports/eval/*.hyp.txt. `--lowercased-tokenized` also scores BLEU the Multi30k papers' way:
hypotheses and references tokenized by Moses' tokenizer (sacremoses, as `sacremoses -l LANG -j 1 tokenize -x`), then
lowercased BLEU on those tokens (`sacrebleu -tok none -lc`), the command bench/README.md prints.
`--until UPDATE` averages the last K snapshots taken at or before UPDATE: what the same run with
`train.max_steps: UPDATE` would have averaged, since with the inverse-sqrt schedule nothing before an update
depends on max_steps (a decaying schedule does, and is refused). One long run thus also answers for shorter
budgets, such as another model's 30 minutes. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:  # the bench imports the project lazily, after its arguments are parsed
    from pipeline.artifacts import Paths
    from pipeline.params import EvaluateParams
    from pipeline.runtime.model_languages import ModelLanguages


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="project directory of a finished run")
    parser.add_argument("--last", type=int, nargs="+", default=[1, 5, 10, 20], help="K: average the last K")
    parser.add_argument("--split", default="val", help="a split of DIR/data/clean: choose K on val; a test set only "
                        "reports the K chosen (a run that kept more snapshots than its config averages)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--directions", nargs="+", help="only these directions (default: every one the model has)")
    parser.add_argument("--length-penalty", type=float, help="instead of DIR/params.yaml's evaluate.length_penalty")
    parser.add_argument("--beam", type=int, help="instead of DIR/params.yaml's evaluate.beam")
    parser.add_argument("--hyp-dir", type=Path, help="also write the translations here, one file per K and direction")
    parser.add_argument("--until", type=int, metavar="UPDATE",
                        help="as if the run had stopped at this update: only the snapshots taken up to it")
    parser.add_argument("--lowercased-tokenized", action="store_true",
                        help="also BLEU lowercased on Moses-tokenized text, the Multi30k papers' convention")
    return parser.parse_args()


def decoding_of(args: argparse.Namespace, decoding: EvaluateParams) -> EvaluateParams:
    """DIR/params.yaml's `evaluate:` block, with --length-penalty and --beam in place of its own where given."""
    from pydantic import ValidationError

    given = {name: value for name, value in (("length_penalty", args.length_penalty), ("beam", args.beam))
             if value is not None}
    try:  # validated as params.yaml's values would be (model_copy does not validate)
        return type(decoding).model_validate({**decoding.model_dump(), **given})
    except ValidationError as error:  # name the option at fault and its value, not a traceback
        sys.exit("; ".join(f"--{str(e['loc'][0]).replace('_', '-')} {e['input']}: {e['msg']}" for e in error.errors()))


def checked_snapshots(paths: Paths, wanted: list[int], until: int | None) -> list[Path]:
    """The run's snapshots (up to update `until`), or an exit naming what it has when the largest K asks for more."""
    from stages.train.checkpoint import AVERAGE_DIR, snapshot_files, snapshot_step

    folder = paths.checkpoints / AVERAGE_DIR
    snapshots = snapshot_files(paths.checkpoints)
    if not snapshots:
        sys.exit(f"{folder}: no snapshots (train with train.average_last > 1)")
    if until is not None:
        steps = [snapshot_step(f) for f in snapshots]
        if until not in steps:
            sys.exit(f"--until {until}: no snapshot of that update in {folder} (it holds {steps[0]}-{steps[-1]}, "
                     f"every {steps[1] - steps[0] if len(steps) > 1 else '-'})")
        snapshots = snapshot_files(paths.checkpoints, until)
    if wanted[-1] > len(snapshots):
        sys.exit(f"--last {wanted[-1]}: {folder} holds {len(snapshots)} snapshots"
                 + (f" up to update {until}" if until is not None else ""))
    return snapshots


def check_until(args: argparse.Namespace, schedule: str) -> None:
    """--until stands for a shorter run only where the learning rate of an update does not depend on max_steps."""
    if args.until is not None and schedule != "inverse_sqrt":
        sys.exit(f"--until {args.until}: {args.run / 'params.yaml'} has train.lr_schedule {schedule}, which decays "
                 "to 0 at max_steps: a shorter run would have taken other updates, not these")


def split_pairs(paths: Paths, args: argparse.Namespace, model_directions: list[str]) -> tuple[dict, list[str]]:
    """The split's pairs by direction and the directions to score, or an exit naming what the run has."""
    from pipeline.artifacts import splits_in
    from pipeline.corpus import read_pairs_by_direction

    split_file = paths.split_file(paths.clean, args.split)
    if not split_file.exists():
        sys.exit(f"--split {args.split}: no {split_file} (the run has {' '.join(splits_in(paths.clean))})")
    pairs = read_pairs_by_direction(split_file)
    directions = args.directions or model_directions
    unknown = sorted(set(directions) - set(pairs))
    if unknown:
        sys.exit(f"--directions {' '.join(unknown)}: {args.split} has {' '.join(sorted(pairs))}")
    return pairs, directions


def lowercased_tokenized_bleu(hyps: list[str], refs: list[str], language: str) -> tuple[float, str]:
    """BLEU and its signature as the Multi30k papers score: both sides through Moses' tokenizer for the target
    language (XML-escaped, as the sacremoses command writes them), then sacreBLEU lowercased with no tokenizer of
    its own."""
    from sacrebleu.metrics import BLEU
    from sacremoses import MosesTokenizer

    moses = MosesTokenizer(lang=language)
    tokenized = [[moses.tokenize(line, return_str=True) for line in side] for side in (hyps, refs)]
    bleu = BLEU(tokenize="none", lowercase=True, force=True)  # tokenized on purpose: no warning about it
    return round(bleu.corpus_score(tokenized[0], [tokenized[1]]).score, 2), str(bleu.get_signature())


@dataclass
class DirectionScores:
    """One averaged model's figures on one split: BLEU per direction as the evaluate stage scores it, the papers'
    lowercased tokenized BLEU and its signature when asked for, and the translations themselves."""
    bleu: dict[str, float] = field(default_factory=dict)
    lowercased_tokenized: dict[str, float] = field(default_factory=dict)
    lowercased_tokenized_signature: str | None = None
    hypotheses: dict[str, list[str]] = field(default_factory=dict)


def score_directions(model: Any, tokenizer: Any, languages: ModelLanguages, pairs: dict, directions: list[str],
                     decoding: EvaluateParams, lowercased_tokenized: bool) -> DirectionScores:
    from pipeline.runtime.languages import Direction
    from stages.evaluate import score, translate

    scores = DirectionScores()
    for direction in directions:
        sources, refs = pairs[direction][1:]
        hyps = translate(model, tokenizer, languages.layout(direction), sources, decoding, progress_bar=False)
        scores.hypotheses[direction] = hyps
        scores.bleu[direction] = score(hyps, refs)["bleu"]
        if lowercased_tokenized:
            scores.lowercased_tokenized[direction], scores.lowercased_tokenized_signature = lowercased_tokenized_bleu(
                hyps, refs, Direction.parse(direction).tgt)
    return scores


def record_average(k: int, steps: list[int], scores: DirectionScores, seconds: float, figures: dict[str, Any],
                   args: argparse.Namespace) -> None:
    """One average's figures: printed, added to the bench's JSON `figures`, its translations written under
    --hyp-dir when given."""
    from stages.evaluate.sentences import write_hypotheses

    row, tokenized_row = scores.bleu, scores.lowercased_tokenized
    mean = sum(row.values()) / len(row)
    print(f"last {k:>3} (updates {steps[0]}-{steps[-1]}): " + "  ".join(f"{d} {b:.2f}" for d, b in row.items())
          + f"  mean {mean:.2f}  ({seconds:.0f} s)")
    figures[f"last_{k}"] = {"first_update": steps[0], "last_update": steps[-1], "bleu": row,
                            "mean_bleu": round(mean, 2)}
    if tokenized_row:
        print("          lowercased tokenized: " + "  ".join(f"{d} {b:.2f}" for d, b in tokenized_row.items()))
        figures[f"last_{k}"]["bleu_lowercased_tokenized"] = tokenized_row
        figures["lowercased_tokenized_signature"] = scores.lowercased_tokenized_signature
    if args.hyp_dir:
        for direction, hyps in scores.hypotheses.items():
            write_hypotheses(args.hyp_dir / f"{args.split}.{direction}.last{k}.hyp.txt", hyps)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from pipeline.artifacts import Paths
    from pipeline.params import load
    from pipeline.runtime.model_languages import ModelLanguages
    from stages.evaluate import load_model
    from stages.train.checkpoint import average_snapshots

    torch.set_num_threads(args.threads)
    paths = Paths(args.run)
    run_params = load(args.run / "params.yaml")
    decoding = decoding_of(args, run_params.evaluate)
    check_until(args, run_params.train.lr_schedule)
    wanted = sorted(set(args.last))
    snapshots = checked_snapshots(paths, wanted, args.until)
    languages = ModelLanguages.read(paths.final_model)
    pairs, directions = split_pairs(paths, args, [str(d) for d in languages.directions.directions])
    model, tokenizer = load_model(paths.final_model)
    if args.hyp_dir:
        args.hyp_dir.mkdir(parents=True, exist_ok=True)

    figures: dict[str, Any] = {"run": str(args.run), "split": args.split, "beam": decoding.beam,
                               "length_penalty": decoding.length_penalty, "threads": args.threads,
                               "snapshots": len(snapshots), "until": args.until}
    print(f"{args.run}: {len(snapshots)} snapshots" + (f" up to update {args.until}" if args.until is not None else "")
          + f", {args.split}, beam {decoding.beam}, length penalty {decoding.length_penalty}, {args.threads} threads")
    for k in wanted:
        weights, steps = average_snapshots(paths.checkpoints, k, args.until)
        model.load_state_dict(weights)
        start = time.perf_counter()
        scores = score_directions(model, tokenizer, languages, pairs, directions, decoding, args.lowercased_tokenized)
        record_average(k, steps, scores, time.perf_counter() - start, figures, args)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
