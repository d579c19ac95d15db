"""Benchmark the data stages (download -> clean -> validate) on Multi30k replicated to large corpora.

For each size, a corpus of that many training pairs is made by replicating Multi30k train: replica 0 is the
original, replica k > 0 carries the number k as a token (placed one of a few ways) plus, now and then, a
first word in another case or a different final punctuation mark, applied to both sides alike and seeded, so
deduplication keeps the copies (and still drops what Multi30k itself repeats). Valid and test are Multi30k
val and test_2016_flickr, read where they are.
The corpus goes to a temporary directory that is removed afterwards.

Each stage then runs in a fresh child process (`--stage NAME --root ROOT` re-enters this script), which
calls `stages.<name>.run(params, Paths(root))` with the project's params.yaml (data section replaced) and
reports its wall seconds and peak RSS as JSON. The parent prints a table, the goals with PASS/MISS beside
the figures, and, as the last line, one JSON object with every figure. This prints figures; it asserts none.

    .venv/bin/python bench/data_prep.py                  # sizes 250000 1000000 (minutes)
    .venv/bin/python bench/data_prep.py --sizes 20000    # a quick look
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
STAGES = ("download", "clean", "validate")
HELDOUT = {"valid": "val", "test_2016_flickr": "test_2016_flickr"}
PROJECT_TO = 4_500_000
GOAL_CLEAN_PAIRS_S = 50_000
GOAL_PEAK_RSS_MB = 2048
GOAL_FLAT_RATIO = 1.25  # "flat": peak RSS at the largest size at most 25% above the smallest
STAGE_BATCH_ROWS = 65_536  # pipeline.corpus.BATCH_ROWS (not imported: the parent stays free of pyarrow)
MB = 1024 * 1024


# --- the corpus ------------------------------------------------------------------------------------------


def read_gz_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def perturb(src: str, tgt: str, k: int, seed: int) -> tuple[str, str]:
    """Replica k > 0 of a pair: the number k as a token, maybe a first word recased or the end mark swapped.

    The choices come from a hash of (seed, k, pair), so a pair repeated in Multi30k stays a duplicate in
    every replica and the clean stage's rejections scale with the corpus as they would on real data.
    """
    h = zlib.crc32(f"{seed}\t{k}\t{src}\t{tgt}".encode())
    if h % 10 < 3:
        case = str.upper if h & 16 else str.lower
        src, tgt = (case(w) + rest for w, rest in (_first_word(s) for s in (src, tgt)))
    if (h >> 5) % 10 < 3 and src.endswith(".") and tgt.endswith("."):
        mark = "!" if h & 512 else ";"
        src, tgt = src[:-1] + mark, tgt[:-1] + mark
    template = ("{k}. {s}", "{s} ({k})", "{s} #{k}", "[{k}] {s}")[(h >> 10) % 4]
    return template.format(k=k, s=src), template.format(k=k, s=tgt)


def _first_word(text: str) -> tuple[str, str]:
    word, sep, rest = text.partition(" ")
    return word, sep + rest


def write_corpus(
    train_src: list[str], train_tgt: list[str], size: int, out: Path, seed: int, gz: bool
) -> tuple[Path, Path]:
    """Write `size` training pairs (replicas of Multi30k train) to out/corpus/train.{en,de}[.gz]."""
    (out / "corpus").mkdir()
    suffix = ".gz" if gz else ""
    paths = (out / "corpus" / f"train.en{suffix}", out / "corpus" / f"train.de{suffix}")
    files = [gzip.open(p, "wt", encoding="utf-8", compresslevel=1) if gz else open(p, "w", encoding="utf-8")
             for p in paths]
    try:
        for n in range(size):
            k, i = divmod(n, len(train_src))
            src, tgt = train_src[i], train_tgt[i]
            if k:
                src, tgt = perturb(src, tgt, k, seed)
            files[0].write(src + "\n")
            files[1].write(tgt + "\n")
    finally:
        for f in files:
            f.close()
    return paths


# --- one stage in a child process ------------------------------------------------------------------------


def peak_rss_mb(who: int) -> float:
    rss = resource.getrusage(who).ru_maxrss
    return rss / MB if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def child(stage: str, root: Path, params_file: Path) -> None:
    """Run one stage on `root` and print {"seconds", "import_s", "import_rss_mb", "peak_rss_mb"} as JSON."""
    start = time.perf_counter()
    sys.path.insert(0, str(REPO))
    import importlib

    import yaml

    from pipeline.artifacts import Paths
    from pipeline.params import parse

    module = importlib.import_module(f"stages.{stage}")
    raw = yaml.safe_load(params_file.read_text(encoding="utf-8")) or {}
    raw["data"] = json.loads((root / "data.json").read_text(encoding="utf-8"))
    params = parse(raw, str(params_file))
    imported = time.perf_counter()
    import_rss = peak_rss_mb(resource.RUSAGE_SELF)
    module.run(params, Paths(root))
    seconds = time.perf_counter() - imported
    peak = max(peak_rss_mb(resource.RUSAGE_SELF), peak_rss_mb(resource.RUSAGE_CHILDREN))
    print(json.dumps({"seconds": seconds, "import_s": imported - start, "import_rss_mb": import_rss,
                      "peak_rss_mb": peak}))


def run_child(stage: str, root: Path, params_file: Path) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", stage, "--root", str(root),
           "--params", str(params_file)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        sys.exit(f"stage {stage} failed (exit {proc.returncode}) on {root}:\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- measuring and reporting ------------------------------------------------------------------------------


def measure_size(size: int, train: tuple[list[str], list[str]], args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"mtpipe-bench-{size}-", dir=args.workdir))
    try:
        started = time.perf_counter()
        src, tgt = write_corpus(*train, size, work, args.seed, args.gzip)
        files = {"train": {"src": str(src), "tgt": str(tgt)}}
        files |= {split: {"src": str(args.multi30k / f"{name}.en.gz"), "tgt": str(args.multi30k / f"{name}.de.gz")}
                  for split, name in HELDOUT.items()}
        (work / "data.json").write_text(json.dumps({"source": "files", "directions": ["en-de"],
                                                    "files": files}), encoding="utf-8")
        result: dict[str, Any] = {"pairs": size, "generate_s": round(time.perf_counter() - started, 2), "stages": {}}
        for stage in STAGES:
            runs = [run_child(stage, work, args.params) for _ in range(args.repeats)]
            seconds = statistics.median(r["seconds"] for r in runs)
            result["stages"][stage] = {
                "seconds": round(seconds, 3),
                "import_s": round(statistics.median(r["import_s"] for r in runs), 3),
                "pairs_per_s": round(size / seconds),
                "import_rss_mb": round(max(r["import_rss_mb"] for r in runs), 1),
                "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
            }
            print(f"  {size:>9,} {stage:<9} {seconds:8.2f} s  peak {result['stages'][stage]['peak_rss_mb']:7.0f} MB",
                  file=sys.stderr, flush=True)
        total = sum(s["seconds"] for s in result["stages"].values())
        result["total"] = {"seconds": round(total, 3), "pairs_per_s": round(size / total),
                           "peak_rss_mb": max(s["peak_rss_mb"] for s in result["stages"].values())}
        clean = json.loads((work / "metrics" / "clean.json").read_text(encoding="utf-8"))["splits"]["train"]
        result["clean_train"] = {k: clean[k] for k in ("input", "kept", "rejected", "reasons")}
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def projection(results: list[dict[str, Any]], key: str | None) -> float:
    """Seconds at PROJECT_TO pairs: the line through the two largest sizes (through 0 when there is one)."""
    points = [(r["pairs"], (r["stages"][key] if key else r["total"])["seconds"]) for r in results[-2:]]
    (n0, t0), (n1, t1) = ([(0, 0.0)] + points)[-2:]
    slope = (t1 - t0) / (n1 - n0)
    return round(t1 + slope * (PROJECT_TO - n1), 1)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("pyarrow", "great_expectations"):
        try:
            found[name] = version(name.replace("_", "-"))
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def print_runs(results: list[dict[str, Any]]) -> None:
    rows = [f"{'pairs':>9}  {'stage':<9} {'run s':>8} {'import s':>8} {'pairs/s':>9} {'peak MB':>8} {'import MB':>9}"]
    for r in results:
        for stage, s in r["stages"].items():
            rows.append(f"{r['pairs']:>9,}  {stage:<9} {s['seconds']:>8.2f} {s['import_s']:>8.2f} "
                        f"{s['pairs_per_s']:>9,} {s['peak_rss_mb']:>8.0f} {s['import_rss_mb']:>9.0f}")
        t = r["total"]
        rows.append(f"{r['pairs']:>9,}  {'all 3':<9} {t['seconds']:>8.2f} {'':>8} {t['pairs_per_s']:>9,} "
                    f"{t['peak_rss_mb']:>8.0f}")
    print("\n".join(rows))

    print("\nclean, train split (kept / rejected by reason):")
    for r in results:
        c = r["clean_train"]
        print(f"  {r['pairs']:>9,}: kept {c['kept']:,}, rejected {c['rejected']:,} {c['reasons']}")


def rss_growth(results: list[dict[str, Any]]) -> dict[str, float]:
    """Each stage's peak RSS at the largest size over the smallest ({} for one size), printed."""
    if len(results) < 2:
        return {}
    first, last = results[0], results[-1]
    flat = {stage: round(last["stages"][stage]["peak_rss_mb"] / first["stages"][stage]["peak_rss_mb"], 3)
            for stage in STAGES}
    print(f"peak RSS ratio {last['pairs']:,} / {first['pairs']:,} pairs: "
          + ", ".join(f"{k} {v:.2f}" for k, v in flat.items()))
    if first["pairs"] < STAGE_BATCH_ROWS:
        print(f"  (the smallest size fits in one {STAGE_BATCH_ROWS:,}-row batch, so this ratio overstates growth)")
    return flat


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    print_runs(results)

    proj = {stage: projection(results, stage) for stage in STAGES} | {"total": projection(results, None)}
    basis = "line through the two largest sizes" if len(results) > 1 else "proportional to the one size"
    print(f"\nprojected run seconds at {PROJECT_TO:,} pairs ({basis}; start-up imports excluded): "
          + ", ".join(f"{k} {v:,.0f}" for k, v in proj.items()))

    flat = rss_growth(results)
    last = results[-1]
    clean_rate = last["stages"]["clean"]["pairs_per_s"]
    peak = max(r["total"]["peak_rss_mb"] for r in results)
    worst_ratio = max(flat.values()) if flat else None
    goals = {
        f"clean >= {GOAL_CLEAN_PAIRS_S:,} pairs/s": (clean_rate >= GOAL_CLEAN_PAIRS_S, f"{clean_rate:,} pairs/s"),
        f"peak RSS <= {GOAL_PEAK_RSS_MB} MB": (peak <= GOAL_PEAK_RSS_MB, f"{peak:.0f} MB"),
        f"peak RSS flat (ratio <= {GOAL_FLAT_RATIO})": (
            None if worst_ratio is None else worst_ratio <= GOAL_FLAT_RATIO,
            "needs two sizes" if worst_ratio is None else f"worst stage ratio {worst_ratio:.2f}",
        ),
    }
    print(f"\ngoals (at {last['pairs']:,} pairs; stated for 250,000 -> 1,000,000):")
    for name, (ok, figure) in goals.items():
        print(f"  {'n/a' if ok is None else 'PASS' if ok else 'MISS':<4}  {name}: {figure}")

    return {
        "sizes": [r["pairs"] for r in results],
        "repeats": args.repeats,
        "gzip": args.gzip,
        "results": results,
        "projection_4_5M_seconds": proj,
        "rss_flat_ratio": flat | ({"max": worst_ratio} if flat else {}),
        "goals": {name: ok for name, (ok, _) in goals.items()},
        "versions": versions(),
        "cpu_count": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000], metavar="N",
                        help="training pairs per corpus (default: 250000 1000000)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per stage and size; the median time is reported (default: 1)")
    parser.add_argument("--multi30k", type=Path, default=MULTI30K,
                        help="directory with Multi30k train/val/test_2016_flickr .{en,de}.gz "
                        "(default: shared/data/multi30k beside the repository)")
    parser.add_argument("--gzip", action="store_true", help="write the training corpus as .gz instead of plain text")
    parser.add_argument("--seed", type=int, default=0, help="seed of the perturbations (default: 0)")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml",
                        help="params file whose sections other than data are used (default: the project's)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the temporary corpora and outputs go (default: the system temp directory)")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # re-entry: run one stage, print JSON
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.stage:
        child(args.stage, args.root, args.params)
        return
    if min(args.sizes) < 1 or args.repeats < 1:
        parser.error("--sizes and --repeats must be positive")
    # Children run in the repo and the stages resolve relative data paths against their root: make all absolute.
    args.multi30k, args.params = args.multi30k.resolve(), args.params.resolve()
    needed = [args.multi30k / f"{name}.{lang}.gz" for name in ("train", *HELDOUT.values()) for lang in ("en", "de")]
    if missing := [str(p) for p in needed if not p.is_file()]:
        sys.exit(f"Multi30k not found: missing {', '.join(missing)}\n(pass --multi30k DIR with train, val and "
                 "test_2016_flickr .en.gz/.de.gz files)")
    train = (read_gz_lines(args.multi30k / "train.en.gz"), read_gz_lines(args.multi30k / "train.de.gz"))
    print(f"data stages on Multi30k train ({len(train[0]):,} pairs) replicated to {args.sizes}, "
          f"{args.repeats} run(s) each", file=sys.stderr)
    results = [measure_size(size, train, args) for size in sorted(set(args.sizes))]
    print(json.dumps(report(results, args)))


if __name__ == "__main__":
    main()
