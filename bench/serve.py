"""Benchmark `mtpipe serve` against the Translator in one process, on the same sentences, in the same run.

    direct   pipeline.runtime.translate.Translator on the export, in this process: the whole corpus in one call
             (token-budget batches, 2 at once, one ONNX Runtime thread each: `mtpipe translate`), and each sentence
             on its own (one thread, as a service worker decodes a batch) for the single-sentence decode time
    service  `mtpipe serve` in a child process on 127.0.0.1 (a free port), called by N concurrent clients in this
             process, one sentence per request, for N in --clients, through each client of --via:
               json              plain JSON over one keep-alive connection per client thread
               libretranslatepy  LibreTranslate's own Python client, unchanged (a form-encoded POST on a new
                                 connection per request, as its users send them)

Per client count: sentences/s, latency p50/p95/p99, errors (any answer but 200, or a failed connection), and the
share of the service's translations identical to the direct ones (fp32: all, as a line's translation does not
depend on its batch). The clients share the machine's cores with the service, as on a 2-core laptop.

Goals, printed with PASS/MISS and asserted nowhere: at 32 clients the service reaches at least 0.6x the direct
whole-corpus throughput with 0 errors; at 1 client its p99 latency is at most 2x the direct single-sentence p99.
A table first, then, as the last line, one JSON object with every figure.

Bounded: each client count sends at most --requests requests (default: every sentence once) and stops after
--time-limit-s seconds; nothing but loopback is used. Both paths translate one direction: the export's only one, or
the one --tgt (and --src, where several sources go into that target) names on a multilingual export.

    .venv/bin/python bench/serve.py --export models/export --test-src ../shared/data/multi30k/test_2016_flickr.en.gz
    .venv/bin/python bench/serve.py --export DIR --test-src FILE --clients 1 8 --requests 200   # a quick look
    .venv/bin/python bench/serve.py --export DIR --test-src FILE --tgt fr                       # multilingual
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.runtime.serve.settings import ServeSettings  # noqa: E402
from tests.service_process import ServiceProcess  # noqa: E402

GOAL_THROUGHPUT_SHARE = 0.6  # of the direct whole-corpus sentences/s, at GOAL_CLIENTS clients
GOAL_CLIENTS = 32
GOAL_P99_RATIO = 2.0  # service p99 at 1 client / direct single-sentence p99
WARMUP_REQUESTS = 8


def read_lines(path: Path, limit: int | None) -> list[str]:
    """Non-blank lines of a plain or .gz UTF-8 file (a blank line is no decoding work for either path)."""
    if not path.is_file():
        sys.exit(f"{path} not found: pass --test-src FILE (one source sentence a line, plain or .gz)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\r\n") for line in f if line.strip()]
    return lines[:limit] if limit else lines


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan")}
    p50, p95, p99 = np.percentile(np.asarray(seconds) * 1000.0, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99)}


# --------------------------------------------------------------------------------------------------- direct


def direct_figures(args: argparse.Namespace, lines: list[str], beam: int) -> tuple[dict[str, Any], list[str]]:
    from pipeline.runtime.translate import Translator

    direction = {"src": args.direction.src, "tgt": args.direction.tgt}
    batched = Translator(args.export, int8=args.int8, threads=args.workers)
    batched.translate(lines[:WARMUP_REQUESTS], beam=beam, **direction)
    started = time.perf_counter()
    translations = batched.translate(lines, beam=beam, **direction)
    seconds = time.perf_counter() - started

    single = Translator(args.export, int8=args.int8, threads=1)
    single.translate(lines[:WARMUP_REQUESTS], beam=beam, **direction)
    times = []
    for line in lines[: args.single_sentences]:
        started = time.perf_counter()
        single.translate([line], beam=beam, **direction)
        times.append(time.perf_counter() - started)
    return {"sentences": len(lines), "seconds": seconds, "sentences_per_s": len(lines) / seconds,
            "single_sentence_ms": percentiles_ms(times), "single_sentences": len(times)}, translations


# --------------------------------------------------------------------------------------------------- service


class ClientRun:
    """N client threads sending one sentence per request until `requests` were sent or `time_limit_s` passed."""

    def __init__(self, url: str, lines: list[str], languages: tuple[str, str], requests: int, time_limit_s: float,
                 via: str = "json"):
        self.base_url, self.url, self.lines, self.languages, self.via = url, urlsplit(url), lines, languages, via
        self.requests, self.time_limit_s = requests, time_limit_s
        self.next_index = 0
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.translations: dict[int, str] = {}
        self.stop_at = 0.0

    def take(self) -> int | None:
        with self.lock:
            if self.next_index >= self.requests or time.monotonic() >= self.stop_at:
                return None
            self.next_index += 1
            return self.next_index - 1

    def client(self) -> None:
        if self.via == "libretranslatepy":
            self.libretranslatepy_client()
            return
        connection = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=120)
        source, target = self.languages
        while (index := self.take()) is not None:
            line = self.lines[index % len(self.lines)]
            body = json.dumps({"q": line, "source": source, "target": target})
            started = time.perf_counter()
            try:
                connection.request("POST", "/translate", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException) as err:
                connection.close()
                connection = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=120)
                with self.lock:
                    self.errors.append(f"{type(err).__name__}: {err}")
                continue
            elapsed = time.perf_counter() - started
            with self.lock:
                if response.status == 200:
                    self.latencies.append(elapsed)
                    self.translations[index] = json.loads(answer)["translatedText"]
                else:
                    self.errors.append(f"{response.status}: {answer[:200]!r}")
        connection.close()

    def libretranslatepy_client(self) -> None:
        import urllib.error

        from libretranslatepy import LibreTranslateAPI

        api = LibreTranslateAPI(self.base_url)
        source, target = self.languages
        while (index := self.take()) is not None:
            started = time.perf_counter()
            try:
                text = api.translate(self.lines[index % len(self.lines)], source, target, timeout=120)
            except urllib.error.HTTPError as err:
                with self.lock:
                    self.errors.append(f"{err.code}: {err.read()[:200]!r}")
                continue
            except OSError as err:
                with self.lock:
                    self.errors.append(f"{type(err).__name__}: {err}")
                continue
            elapsed = time.perf_counter() - started
            with self.lock:
                self.latencies.append(elapsed)
                self.translations[index] = text

    def run(self, clients: int) -> dict[str, Any]:
        threads = [threading.Thread(target=self.client, daemon=True) for _ in range(clients)]
        started = time.monotonic()
        self.stop_at = started + self.time_limit_s
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.monotonic() - started
        return {"clients": clients, "requests": self.next_index, "answered": len(self.latencies),
                "errors": len(self.errors), "first_errors": self.errors[:3], "seconds": seconds,
                "sentences_per_s": len(self.latencies) / seconds, "latency_ms": percentiles_ms(self.latencies)}


def service_figures(args: argparse.Namespace, lines: list[str], direct: list[str]
                    ) -> dict[str, dict[int, dict[str, Any]]]:
    """Per client (--via) and client count, the figures of one run of ClientRun."""
    flags = ["--workers", str(args.workers), "--max-wait-ms", str(args.max_wait_ms),
             "--max-batch-tokens", str(args.max_batch_tokens), *(["--int8"] if args.int8 else [])]
    figures: dict[str, dict[int, dict[str, Any]]] = {}
    with ServiceProcess(args.export, *flags) as service:
        languages = (args.direction.src, args.direction.tgt)
        ClientRun(service.url, lines, languages, WARMUP_REQUESTS, 30).run(2)
        for via in args.via:
            figures[via] = {}
            for clients in args.clients:
                print(f"service through {via}, {clients} clients ...", file=sys.stderr, flush=True)
                run = ClientRun(service.url, lines, languages, args.requests or len(lines), args.time_limit_s, via)
                result = figures[via][clients] = run.run(clients)
                same = [text == direct[i % len(direct)] for i, text in run.translations.items()]
                result["identical_share"] = sum(same) / len(same) if same else float("nan")
    return figures


# --------------------------------------------------------------------------------------------------- report


def report(args: argparse.Namespace, direct: dict[str, Any], by_client: dict[str, dict[int, dict[str, Any]]]) -> dict:
    single = direct["single_sentence_ms"]
    print(f"\n{args.test_src.name} ({args.direction}): {direct['sentences']} sentences, beam {args.beam_used}, "
          f"{'int8' if args.int8 else 'fp32'}, {args.workers} workers, max wait {args.max_wait_ms:g} ms, "
          f"max batch tokens {args.max_batch_tokens}")
    print(f"direct, whole corpus: {direct['sentences_per_s']:.1f} sentences/s ({direct['seconds']:.2f} s); "
          f"one sentence at a time: p50 {single['p50']:.1f} ms, p99 {single['p99']:.1f} ms "
          f"({direct['single_sentences']} sentences)")
    header = (f"{'client':<16} {'clients':>7} {'requests':>8} {'sent/s':>8} {'x direct':>8} {'p50 ms':>8} "
              f"{'p95 ms':>8} {'p99 ms':>8} {'errors':>6} {'identical':>9}")
    print(header)
    print("-" * len(header))
    for via, service in by_client.items():
        for clients, r in service.items():
            r["share_of_direct"] = r["sentences_per_s"] / direct["sentences_per_s"]
            lat = r["latency_ms"]
            print(f"{via:<16} {clients:>7} {r['answered']:>8} {r['sentences_per_s']:>8.1f} "
                  f"{r['share_of_direct']:>8.2f} {lat['p50']:>8.1f} {lat['p95']:>8.1f} {lat['p99']:>8.1f} "
                  f"{r['errors']:>6} {r['identical_share']:>9.3f}")
            for error in r["first_errors"]:
                print(f"  {via}, {clients} clients: {error}")
    # The goals are the service's own, measured through plain JSON (the first client when json was not run).
    service = by_client.get("json") or next(iter(by_client.values()))
    goals = {}
    if GOAL_CLIENTS in service:
        r = service[GOAL_CLIENTS]
        goals["throughput"] = {"share_of_direct": r["share_of_direct"], "errors": r["errors"],
                               "met": r["share_of_direct"] >= GOAL_THROUGHPUT_SHARE and r["errors"] == 0}
    if 1 in service:
        ratio = service[1]["latency_ms"]["p99"] / single["p99"]
        goals["latency"] = {"p99_vs_single_sentence_p99": ratio, "met": ratio <= GOAL_P99_RATIO}
    print("Goals:")
    if "throughput" in goals:
        g = goals["throughput"]
        print(f"  {GOAL_CLIENTS} clients >= {GOAL_THROUGHPUT_SHARE:g}x direct, 0 errors: {g['share_of_direct']:.2f}x, "
              f"{g['errors']} errors  {'PASS' if g['met'] else 'MISS'}")
    if "latency" in goals:
        g = goals["latency"]
        print(f"  1 client p99 <= {GOAL_P99_RATIO:g}x single-sentence p99: {g['p99_vs_single_sentence_p99']:.2f}x  "
              f"{'PASS' if g['met'] else 'MISS'}")
    return {"export": str(args.export), "test_src": str(args.test_src), "direction": str(args.direction),
            "beam": args.beam_used, "int8": args.int8,
            "workers": args.workers, "max_wait_ms": args.max_wait_ms, "max_batch_tokens": args.max_batch_tokens,
            "machine": platform.machine(), "python": platform.python_version(), "direct": direct,
            "service": {via: {str(c): r for c, r in runs.items()} for via, runs in by_client.items()},
            "goals": goals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", type=Path, default=REPO / "models" / "export", help="default: %(default)s")
    parser.add_argument("--test-src", type=Path, required=True, help="source sentences, one a line (plain or .gz)")
    parser.add_argument("--limit", type=int, default=None, help="first N sentences only")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="default: %(default)s")
    parser.add_argument("--requests", type=int, default=None,
                        help="most requests per client count (default: one per sentence)")
    parser.add_argument("--time-limit-s", type=float, default=120.0,
                        help="most seconds per client count (default: %(default)s)")
    parser.add_argument("--single-sentences", type=int, default=300,
                        help="sentences decoded one at a time for the single-sentence time (default: %(default)s)")
    parser.add_argument("--via", nargs="+", choices=["json", "libretranslatepy"], default=["json", "libretranslatepy"],
                        help="the clients the service is called through (default: %(default)s)")
    parser.add_argument("--tgt", default=None, help="target language (needed on an export of several)")
    parser.add_argument("--src", default=None, help="source language (needed where several go into --tgt)")
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--workers", type=int, default=2, help="the service's --workers and the direct threads")
    defaults = ServeSettings(model_dir=Path("unused"))
    parser.add_argument("--max-wait-ms", type=float, default=defaults.max_wait_ms,
                        help="the service's (default: %(default)s)")
    parser.add_argument("--max-batch-tokens", type=int, default=defaults.max_batch_tokens,
                        help="the service's (default: %(default)s)")
    args = parser.parse_args()

    from pipeline.runtime.export_format import ExportManifest
    from pipeline.runtime.languages import UnknownDirection

    manifest = ExportManifest.read(args.export)
    args.beam_used = manifest.generation.beam  # the service's default too
    try:
        args.direction = manifest.pairs.find(args.src, args.tgt)
    except UnknownDirection as err:
        sys.exit(f"{args.export}: {err} (--tgt, --src)")
    lines = read_lines(args.test_src, args.limit)
    print(f"direct: {len(lines)} sentences ...", file=sys.stderr, flush=True)
    direct, translations = direct_figures(args, lines, args.beam_used)
    service = service_figures(args, lines, translations)
    figures = report(args, direct, service)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
