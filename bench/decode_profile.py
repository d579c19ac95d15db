"""Where an export's decoding time goes: ONNX Runtime's own per-node profile of the Translator on Multi30k
test_2016_flickr, summed by operator type, for one or more export directories side by side (a teacher and its
distilled student, fp32 or int8 graphs).

One ONNX Runtime thread and one batch at a time (`threads=1`, otherwise the Translator's own session settings), so
a node's time is its own and not another batch's: the shares are what each kind of work costs, not the 2-thread
speed bench/decode.py measures (the profiler adds its own cost to every node, so the wall time here is not a speed
figure either). Per export and graph precision: the wall time of the whole translation, the share of it spent
inside ONNX Runtime's encoder and decoder runs (the rest is the numpy beam search, tokenisation and the Python
between calls), and per operator type its milliseconds, its share of the node time, and the node time per run.

    .venv/bin/python bench/decode_profile.py --export models/export models/student/export --int8
    .venv/bin/python bench/decode_profile.py --export models/export --limit 200

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
TEST_SET = "test_2016_flickr"
TOP_OPS = 12


def node_times(trace_file: str) -> tuple[dict[str, float], int, float]:
    """(microseconds per operator type, the number of runs, microseconds inside runs) from a profile trace."""
    events = json.loads(Path(trace_file).read_text())
    by_op: dict[str, float] = defaultdict(float)
    runs, run_us = 0, 0.0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            runs += 1
            run_us += event["dur"]
    return dict(by_op), runs, run_us


def profile_export(export_dir: Path, int8: bool, sources: list[str], beam: int, trace_prefix: Path,
                   shortlist: bool = False) -> dict[str, Any]:
    """One export's profile: its Translator's sessions replaced by profiling ones over the same graphs (the
    model's sessions are plain attributes). Their first call, with its allocations, is in the profile: ONNX
    Runtime starts profiling when a session is created."""
    from pipeline.runtime.translate import Translator, ort_session

    translator = Translator(export_dir, int8=int8, threads=1, shortlist=shortlist)
    model = translator.model
    model.encoder = ort_session(model.encoder_path, 1, f"{trace_prefix}-encoder")
    model.decoder = ort_session(model.decoder_path, 1, f"{trace_prefix}-decoder")
    start = time.perf_counter()
    translator.translate(sources, beam=beam)
    wall = time.perf_counter() - start
    figures: dict[str, Any] = {"export": str(export_dir), "int8": int8, "wall_s": round(wall, 3)}
    inside = 0.0
    for graph, session in (("encoder", model.encoder), ("decoder", model.decoder)):
        by_op, runs, run_us = node_times(session.end_profiling())
        total = sum(by_op.values())
        inside += run_us
        top = sorted(by_op.items(), key=lambda item: -item[1])
        figures[graph] = {
            "runs": runs,
            "run_ms": round(run_us / 1e3, 1),
            "node_ms": round(total / 1e3, 1),
            "ops": {op: {"ms": round(us / 1e3, 1), "share": round(us / total, 4),
                         "us_per_run": round(us / max(runs, 1), 1)} for op, us in top},
        }
    figures["inside_ort_share"] = round(inside / 1e6 / wall, 4)
    return figures


def print_profile(figures: dict[str, Any]) -> None:
    name = f"{figures['export']} ({'int8' if figures['int8'] else 'fp32'})"
    print(f"\n{name}: {figures['wall_s']:.2f} s on one thread, {figures['inside_ort_share']:.0%} inside ONNX Runtime")
    for graph in ("encoder", "decoder"):
        g = figures[graph]
        print(f"  {graph}: {g['runs']} runs, {g['run_ms']:.0f} ms in runs, {g['node_ms']:.0f} ms in nodes")
        for op, f in list(g["ops"].items())[:TOP_OPS]:
            print(f"    {op:<28} {f['ms']:>9.1f} ms {f['share']:>7.1%} {f['us_per_run']:>10.1f} us/run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", type=Path, nargs="+", required=True, help="export directories (models/export)")
    parser.add_argument("--int8", action="store_true", help="profile the int8 graphs instead of the fp32 ones")
    parser.add_argument("--shortlist", action="store_true",
                        help="with the export's lexical shortlist where it has one (default: the whole vocabulary)")
    parser.add_argument("--multi30k", type=Path, default=MULTI30K, help="default: %(default)s")
    parser.add_argument("--src", default="en", help="the test set's source language (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="first N test sentences only")
    parser.add_argument("--beam", type=int, default=4)
    args = parser.parse_args()
    path = args.multi30k / f"{TEST_SET}.{args.src}.gz"
    if not path.is_file():
        sys.exit(f"{path} not found: pass --multi30k DIR")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        sources = [line.rstrip("\r\n") for line in f][: args.limit]
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for number, export_dir in enumerate(args.export):
            figures = profile_export(export_dir, args.int8, sources, args.beam, Path(workdir) / str(number),
                                     args.shortlist)
            print_profile(figures)
            results.append(figures)
    print(json.dumps({"test_set": TEST_SET, "sentences": len(sources), "beam": args.beam, "threads": 1,
                      "exports": results}))


if __name__ == "__main__":
    main()
