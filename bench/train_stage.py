"""Benchmark: the training stage's own speed for several model or training settings, timed back to back.

    .venv/bin/python bench/train_stage.py --run DIR [--updates 500] [--rounds 2] [--threads 2]
        [--budget-seconds 1800] --variant NAME [KEY=VALUE ...] --variant NAME KEY=VALUE ... [--workdir OUT]

DIR is a project directory whose tokenize stage has run (its data/tokenized), such as a clone of this repository
after `cp configs/multi30k-cpu-ref.yaml params.yaml && dvc repro tokenize`. Each variant is DIR/params.yaml with
its overrides (model.* and train.* keys: the tokenized data is DIR's) and train.max_steps = --updates; the first
variant is the baseline, and one given without overrides is DIR's config itself. The real training stage
(`python -m stages.train`, in a folder of its own whose data/tokenized is DIR's) trains each variant for --updates
updates on --threads cores (train.threads is --threads over the variant's train.nproc, so one process on two threads
and two DDP processes on one thread each compare on the same cores), with all that the stage does meanwhile:
validation every train.valid_every updates with its greedy BLEU, last.pt and the snapshots to average every
train.save_every. bench/train_throughput.py times the loop's updates alone, which misjudges a change whose cost
lies outside them (a deeper decoder decodes the validation BLEU more slowly); the updates a config's 30 minutes
buy are the stage's, so they come from here.

Rounds alternate the order (A B, then B A, ...), so a machine that slows down or speeds up weighs on every
variant alike. Per variant: the stage's train_seconds per round (metrics/train.json: the time train.max_minutes
limits, without the start and the final average), their median, updates a second, the speed against the
baseline's, and the updates of the budget: those --budget-seconds buy at the measured rate, and the baseline's own
train.max_steps (DIR's, measured over whole runs) times the variant's speed. The second is the one to use: the
first updates validate a barely trained model, whose greedy outputs run to the length limit, so a short measurement
runs slower than a whole run and its rate understates a budget, while the ratio between variants carries over.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# What a variant may change: the model and its training. Anything else would need DIR's data tokenized anew.
VARIANT_SECTIONS = ("model", "train")
# Set by the bench for every variant alike (its options), so a variant may not set them.
BENCH_KEYS = {"train.max_steps": "--updates", "train.threads": "--threads", "train.max_minutes": "--updates"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="project directory with data/tokenized")
    parser.add_argument("--variant", nargs="+", action="append", required=True, metavar="NAME [KEY=VALUE]",
                        help="a name and the params.yaml overrides it trains with (repeat; the first is the baseline)")
    parser.add_argument("--updates", type=int, default=500, help="updates each variant trains (train.max_steps)")
    parser.add_argument("--rounds", type=int, default=2, help="times each variant trains, the order alternating")
    parser.add_argument("--threads", type=int, default=2,
                        help="the cores every variant trains on: train.threads is this over the variant's train.nproc")
    parser.add_argument("--budget-seconds", type=float, default=1800.0,
                        help="the training time a config's step budget stands for (30 minutes)")
    parser.add_argument("--workdir", type=Path, help="keep each training run's folder here (default: removed)")
    args = parser.parse_args()
    for option in ("updates", "rounds", "threads"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be at least 1")
    if args.budget_seconds <= 0:
        parser.error("--budget-seconds must be positive")
    return args


def variant_params(run_params: dict[str, Any], variant: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """DIR's params with the variant's overrides and the bench's step count and threads, validated as params.yaml
    would be; an exit naming the variant and the key at fault otherwise."""
    import copy

    from pipeline.params import ParamsError, parse
    from pipeline.runtime.errors import PipelineError
    from pipeline.tools.cli import parse_overrides
    from stages.train import resolve_nproc

    name, pairs = variant[0], variant[1:]
    try:
        overrides = parse_overrides(pairs)
    except ValueError as error:
        sys.exit(f"--variant {name}: {error}")
    raw = copy.deepcopy(run_params)
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if section not in VARIANT_SECTIONS or not field:
            sys.exit(f"--variant {name}: {key}: only model.* and train.* keys (the tokenized data is {args.run}'s)")
        if key in BENCH_KEYS:
            sys.exit(f"--variant {name}: {key} is the bench's to set ({BENCH_KEYS[key]})")
        raw.setdefault(section, {})[field] = value
    raw.setdefault("train", {}).update(max_steps=args.updates, threads=args.threads, max_minutes=None)
    try:
        # The training stage's own count of processes, from the validated value (`auto`: one per GPU, else 1).
        processes = resolve_nproc(parse(raw, f"--variant {name}").train.nproc)
    except ParamsError as error:
        sys.exit(str(error))
    except PipelineError as error:  # more processes than the machine's GPUs
        sys.exit(f"--variant {name}: {error}")
    if args.threads % processes:
        sys.exit(f"--variant {name}: train.nproc={processes} processes cannot share --threads {args.threads} evenly")
    raw["train"]["threads"] = args.threads // processes
    return raw


def max_steps_of(run_params: dict[str, Any], params_file: Path) -> int | None:
    """DIR's params validated (exits naming the file), and its train.max_steps: the budget the speeds scale."""
    from pipeline.params import ParamsError, parse

    try:
        return parse(run_params, str(params_file)).train.max_steps
    except ParamsError as error:
        sys.exit(str(error))


def train_once(folder: Path, tokenized: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The training stage in `folder` (data/tokenized linked to DIR's), as dvc.yaml runs it; its metrics/train.json."""
    import yaml

    (folder / "data").mkdir(parents=True)
    (folder / "data" / "tokenized").symlink_to(tokenized.resolve())
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with open(folder / "train.log", "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, "-m", "stages.train"], cwd=folder, env=env, stdout=log,
                              stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = (folder / "train.log").read_text(encoding="utf-8").splitlines()[-15:]
        sys.exit(f"the training stage failed in {folder} (exit {done.returncode}):\n" + "\n".join(tail))
    return json.loads((folder / "metrics" / "train.json").read_text(encoding="utf-8"))


def time_rounds(params: dict[str, dict[str, Any]], tokenized: Path, work: Path,
                args: argparse.Namespace) -> tuple[dict[str, list[dict[str, Any]]], list[list[str]]]:
    """Every variant trained once a round, in order and then in reverse: each run's metrics, and the orders."""
    names = list(params)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    orders = []
    for round_index in range(args.rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        orders.append(order)
        for name in order:
            metrics = train_once(work / f"round{round_index + 1}-{name}", tokenized, params[name])
            if metrics["steps"] != args.updates:
                sys.exit(f"--variant {name}: stopped at update {metrics['steps']} ({metrics['stop_reason']}), "
                         f"not {args.updates}: its time is not comparable")
            runs[name].append(metrics)
            print(f"round {round_index + 1} {name}: {metrics['train_seconds']:.1f} s, "
                  f"{args.updates / metrics['train_seconds']:.2f} updates/s, {metrics['precision']}")
    return runs, orders


def summary(names: list[str], runs: dict[str, list[dict[str, Any]]], baseline_steps: int | None,
            args: argparse.Namespace) -> dict[str, Any]:
    """Median train_seconds per variant, updates a second, speed against the first variant, and the updates of the
    budget: at the measured rate, and as the baseline's own max_steps times the variant's speed (the first updates,
    validated while the model is poor, are slower than a whole run's: the ratio carries over, the rate less so)."""
    medians = {name: statistics.median(m["train_seconds"] for m in runs[name]) for name in names}
    base = medians[names[0]]
    figures = {}
    for name in names:
        rate = args.updates / medians[name]
        figures[name] = {
            "train_seconds": [m["train_seconds"] for m in runs[name]],
            "median_seconds": round(medians[name], 1),
            "updates_per_s": round(rate, 3),
            "speed_vs_baseline": round(base / medians[name], 3),
            "budget_updates": int(rate * args.budget_seconds),
            "baseline_steps_at_speed": int(baseline_steps * base / medians[name]) if baseline_steps else None,
            "tgt_tokens_per_s": statistics.median(m["tgt_tokens_per_s"] for m in runs[name]),
            "precision": runs[name][0]["precision"],
        }
    return figures


def main() -> None:
    args = parse_args()
    import yaml

    names = [variant[0] for variant in args.variant]
    if len(set(names)) != len(names):
        sys.exit(f"--variant names must differ: {' '.join(names)}")
    tokenized = args.run / "data" / "tokenized"
    if not (tokenized / "meta.json").exists():
        sys.exit(f"{tokenized}: not there (run the tokenize stage in {args.run} first: dvc repro tokenize)")
    params_file = args.run / "params.yaml"
    if not params_file.is_file():
        sys.exit(f"{params_file}: not there")
    run_params = yaml.safe_load(params_file.read_text(encoding="utf-8")) or {}
    # DIR's own file first, so that an error in it names the file and not the first variant.
    baseline_steps = max_steps_of(run_params, params_file)
    if len(args.variant[0]) > 1:  # DIR's max_steps is the baseline's budget only for DIR's config as it stands
        baseline_steps = None
    params = {variant[0]: variant_params(run_params, variant, args) for variant in args.variant}

    if args.workdir and args.workdir.exists() and any(args.workdir.iterdir()):
        sys.exit(f"--workdir {args.workdir}: not empty (it would mix this run's folders with an earlier one's)")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="train-stage-bench-"))
    print(f"{args.run}: {len(names)} variants x {args.rounds} rounds of {args.updates} updates, {args.threads} threads")
    try:
        runs, orders = time_rounds(params, tokenized, work, args)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    figures = summary(names, runs, baseline_steps, args)
    scaled = (f"as {names[0]}'s max_steps ({baseline_steps}) x its speed" if baseline_steps else
              f"(no step budget to scale: {names[0]} is not {params_file} as it stands, or it sets no max_steps)")
    for name, row in figures.items():
        print(f"{name}: median {row['median_seconds']} s, {row['updates_per_s']} updates/s, "
              f"{row['speed_vs_baseline']}x {names[0]}, {row['budget_updates']} updates in "
              f"{args.budget_seconds:.0f} s at this rate, {row['baseline_steps_at_speed'] or ''} {scaled}")
    print(json.dumps({"run": str(args.run), "updates": args.updates, "rounds": args.rounds, "threads": args.threads,
                      "budget_seconds": args.budget_seconds, "orders": orders, "variants": figures}))


if __name__ == "__main__":
    main()
