"""`mtpipe`: the command line. It starts fast: no heavy library is imported until a subcommand needs it.

  mtpipe run            dvc repro (initialising DVC first if needed), then the summary
  mtpipe summary        test scores, training and export figures, where each artifact and page is
  mtpipe plots          the training curves as a page that works offline (dvc plots show, assets local)
  mtpipe params         validate params.yaml and print the effective settings (presets resolved)
  mtpipe stage NAME     run one stage directly, outside DVC (for debugging)
  mtpipe flow ...       Prefect: run the pipeline flow once, run an experiment, serve the deployments
  mtpipe translate      stdin to stdout, line by line, with the exported model (`--tgt fr` on a multi-target one)
  mtpipe serve          the exported model as an HTTP translation service (needs the `serve` extra)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.artifacts import Paths, read_json
from pipeline.params import ParamsError, load
from pipeline.run_figures import export_parity, score_lines, training_run
from pipeline.tools.plots_page import PLOTS_DIR, write_plots_page

STAGES = ("check_params", "download", "clean", "validate", "tokenize", "train", "evaluate", "export", "card")
# The distilled student's: `distill`, then the teacher's modules from clean on, run with --student.
STUDENT_STAGES = ("distill", *(f"student_{name}" for name in STAGES[2:]))


def stage_command(name: str) -> list[str]:
    """The command dvc.yaml runs for a stage: `python -m stages.<name>`, a student's with --student."""
    if name.startswith("student_"):
        return [sys.executable, "-m", f"stages.{name.removeprefix('student_')}", "--student"]
    return [sys.executable, "-m", f"stages.{name}"]


def _dvc() -> list[str]:
    """The dvc of this interpreter's environment, so `mtpipe` works without an activated venv."""
    local = Path(sys.executable).with_name("dvc")
    return [str(local)] if local.exists() else [shutil.which("dvc") or "dvc"]


def ensure_dvc_repo(root: Path) -> None:
    if (root / ".dvc").is_dir():
        return
    scm = (root / ".git").exists()
    subprocess.run([*_dvc(), "init", "--quiet", *([] if scm else ["--no-scm"])], cwd=root, check=True)
    subprocess.run([*_dvc(), "config", "core.analytics", "false"], cwd=root, check=True)
    subprocess.run([*_dvc(), "config", "core.check_update", "false"], cwd=root, check=True)
    # Outputs as hard links into the cache where the filesystem allows: the release and models/final are one copy
    # (the project's own .dvc/config says why).
    subprocess.run([*_dvc(), "config", "cache.type", "hardlink,copy"], cwd=root, check=True)


def _run_lines(paths: Paths) -> list[str]:
    lines = []
    run = training_run(paths)
    if run is not None:
        minutes = f" in {run.seconds / 60:.1f} min" if run.seconds is not None else ""
        valid = f"; best valid loss {run.best_valid_loss}" if run.best_valid_loss is not None else ""
        bleu = f", valid BLEU {run.best_valid_bleu}" if run.best_valid_bleu is not None else ""
        lines.append(f"Training: {run.steps} steps ({run.stop_reason}){minutes} on {run.hardware}{valid}{bleu}")
    parity = export_parity(paths)
    if parity is not None and parity.identical_share is not None:
        int8 = (f"; int8: {parity.int8_identical_share:.1%} identical, BLEU delta {parity.int8_bleu_delta:+.2f}"
                if parity.int8_identical_share is not None else "")
        lines.append(f"Export ({', '.join(parity.formats)}): {parity.identical_share:.1%} of greedy outputs "
                     f"identical to PyTorch, max logit diff {parity.max_logit_diff:.1e}, "
                     f"BLEU delta {parity.bleu_delta:+.2f}{int8}")
    return lines


def summary(paths: Paths) -> str:
    """Scores, training and export figures, then where each page and artifact is (or that it is missing)."""
    pages = [
        ("evaluation report", paths.eval_dir / "index.html", ""),
        ("validation report (Data Docs)", paths.validation_report / "index.html", ""),
        ("training curves", paths.root / PLOTS_DIR / "index.html", ": run `mtpipe plots`"),
    ]
    artifacts = [
        ("raw corpus", paths.raw),
        ("clean corpus + rejected rows", paths.clean),
        ("SentencePiece model + encoded arrays", paths.tokenized),
        ("trained model (save_pretrained)", paths.final_model),
        ("training curves (DVCLive)", paths.dvclive),
        ("hypotheses, sentence table, report.md", paths.eval_dir),
        ("ONNX + TorchScript export", paths.export),
        ("release: model + model card README.md", paths.release),
        ("metrics", paths.root / "metrics"),
    ]
    run = training_run(paths)
    warning = [f"WARNING: {run.cut_short}"] if run is not None and run.cut_short else []
    lines = [*warning, *score_lines(paths), *_run_lines(paths),
             "Pages (open in a browser; they load nothing from the network):"]
    for label, path, hint in pages:
        lines.append(f"  {label:<38} {path}{'' if path.exists() else f'  (missing{hint})'}")
    lines.append("Artifacts:")
    for label, path in artifacts:
        lines.append(f"  {label:<38} {path}{'' if path.exists() else '  (missing)'}")
    return "\n".join(lines + student_summary(paths.student()))


def student_summary(paths: Paths) -> list[str]:
    """The distilled student's scores (its teacher's beside), training and export; nothing while distillation is
    off or has not run."""
    distill_file = paths.metrics("distill")
    distill = read_json(distill_file) if distill_file.is_file() else {}
    if "teacher" not in distill:
        return []
    lines = ["", f"Student distilled from {distill['teacher']['export']} (teacher {distill['teacher']['digest']}): "
             f"{distill['sources']} training sources translated at {distill['sentences_per_s']} sentences/s"]
    lines += [*score_lines(paths), *_run_lines(paths)]
    for label, path in (("student evaluation report", paths.eval_dir / "index.html"),
                        ("student export", paths.export), ("student release + card", paths.release)):
        lines.append(f"  {label:<38} {path}{'' if path.exists() else '  (missing)'}")
    return lines


def _add_plots_parser(sub: argparse._SubParsersAction) -> None:
    plots_p = sub.add_parser(
        "plots",
        help="the training curves as a page that works offline (instead of plain `dvc plots show`)",
        description="Run `dvc plots show` with a page template that loads vega from files beside it, copy those "
        "files there, and check that the page loads nothing from another host.",
    )
    plots_p.add_argument("-o", "--out", type=Path, default=None,
                         help=f"output directory (default: {PLOTS_DIR})")
    plots_p.add_argument("targets", nargs="*", help="plot files or directories (default: every plot of dvc.yaml)")


def plots_command(args: argparse.Namespace, paths: Paths) -> int:
    from pipeline.runtime.errors import PipelineError

    try:
        page = write_plots_page(_dvc(), paths.root.resolve(), args.out or PLOTS_DIR, args.targets)
    except PipelineError as err:
        print(f"mtpipe plots: {err}", file=sys.stderr)
        return 1
    print(f"training curves: {page} (works offline: its scripts are copied beside it)")
    return 0


def _add_flow_parser(sub: argparse._SubParsersAction) -> None:
    flow_p = sub.add_parser("flow", help="Prefect flows over the same DAG (needs the `flow` extra)")
    flow_sub = flow_p.add_subparsers(dest="flow_command", required=True)
    run_p = flow_sub.add_parser("run", help="run the pipeline flow once: every dvc.yaml stage as a Prefect task")
    run_p.add_argument("--push", action="store_true", help="end with `dvc push` to the default DVC remote")
    exp_p = flow_sub.add_parser("experiment", help="run the experiment flow once: dvc exp run -S ..., markdown report")
    exp_p.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="a params.yaml override, e.g. -S train.lr=0.001 (repeatable)")
    exp_p.add_argument("-n", "--name", help="experiment name (default: DVC picks one)")
    serve_p = flow_sub.add_parser("serve", help="serve the prefect.yaml deployments (nightly, experiment) here")
    for p in (run_p, exp_p, serve_p):
        p.add_argument("--project", default=".", help="project directory (default: the current one)")


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """`key=value` strings to a mapping; values read as YAML so `0.001` is a number and `tiny` a string."""
    import yaml

    overrides: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def flow_command(args: argparse.Namespace) -> int:
    try:
        from pipeline.tools import flow
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] == "prefect":
            print("Prefect is not installed: pip install -e '.[flow]'", file=sys.stderr)
            return 2
        raise
    if args.flow_command == "serve":
        flow.serve_deployments(args.project)
        return 0
    if args.flow_command == "experiment":
        try:
            overrides = parse_overrides(args.overrides)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        state = flow.experiment(overrides, name=args.name, project_dir=args.project, return_state=True)
    else:
        state = flow.pipeline(project_dir=args.project, push=args.push, return_state=True)
    print(f"flow run {state.name}" + (f": {state.message}" if state.message else ""))
    return 0 if state.is_completed() else 1


def _add_translate_parser(sub: argparse._SubParsersAction) -> None:
    tr_p = sub.add_parser(
        "translate",
        help="translate stdin to stdout, line by line, with an exported model",
        description="Translate UTF-8 lines from stdin to stdout (line i -> line i; empty lines "
        "stay empty) with the ONNX graphs of an export directory, on ONNX Runtime, into --tgt (which a model of "
        "several target languages needs).",
    )
    tr_p.add_argument("--model", default=str(Paths().export), help="export directory (default: %(default)s)")
    tr_p.add_argument("--tgt", default=None, metavar="LANG",
                      help="target language, e.g. fr; needed when the model has several (an error lists them)")
    tr_p.add_argument("--src", default=None, metavar="LANG",
                      help="source language; needed only when several go into the target")
    tr_p.add_argument("--beam", type=int, default=None, help="beam size; 1 is greedy (default: the export's)")
    tr_p.add_argument("--length-penalty", type=float, default=None, help="default: the export's")
    tr_p.add_argument("--int8", action="store_true", help="use the int8 graphs (export.int8: true)")
    tr_p.add_argument("--no-shortlist", dest="shortlist", action="store_false",
                      help="rank the whole vocabulary even where the export has a lexical shortlist (export.shortlist)")
    tr_p.add_argument("--threads", type=int, default=2,
                      help="batches decoded at once, one CPU thread each (default: %(default)s)")
    tr_p.add_argument(
        "--max-tokens",
        type=int,
        default=6000,
        help="rows x longest source per batch, beams included (default: %(default)s)",
    )


def translate(args: argparse.Namespace) -> int:
    import logging

    from pipeline.runtime.errors import PipelineError
    from pipeline.runtime.languages import UnknownDirection
    from pipeline.runtime.translate import Translator, read_lines

    logging.basicConfig(level=logging.WARNING, format="mtpipe translate: %(levelname)s: %(message)s")
    try:
        if args.beam is not None and args.beam < 1:
            raise PipelineError(f"--beam must be at least 1, got {args.beam}")
        if args.threads < 1:
            raise PipelineError(f"--threads must be at least 1, got {args.threads}")
        translator = Translator(args.model, int8=args.int8, threads=args.threads, max_tokens=args.max_tokens,
                                shortlist=args.shortlist)
        # Before reading stdin: a direction the model does not translate is a usage error, said at once.
        direction = translator.direction(args.tgt, args.src)
        lines = read_lines(sys.stdin.buffer)
        beam = args.beam or translator.generation.beam
        out = translator.translate(lines, beam=beam, length_penalty=args.length_penalty, tgt=direction.tgt,
                                   src=direction.src)
    except UnknownDirection as err:
        print(f"mtpipe translate: {err} (--tgt, --src)", file=sys.stderr)
        return 2
    except PipelineError as err:
        print(f"mtpipe translate: {err}", file=sys.stderr)
        return 1
    # Bytes, so the output is UTF-8 whatever the locale says.
    sys.stdout.buffer.write("".join(line + "\n" for line in out).encode("utf-8"))
    sys.stdout.flush()
    return 0


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from dataclasses import fields

    from pipeline.runtime.serve.settings import ServeSettings

    default = {f.name: f.default for f in fields(ServeSettings)}
    p = sub.add_parser(
        "serve",
        help="serve an exported model over HTTP: POST /translate (LibreTranslate's API), /metrics, /docs",
        description="Serve the ONNX graphs of an export directory over HTTP (FastAPI + uvicorn), batching "
        "concurrent requests together. Needs the `serve` extra: pip install -e '.[serve]'.",
    )
    p.add_argument("--model", dest="model_dir", default=str(Paths().export),
                   help="export directory (default: %(default)s)")
    p.add_argument("--int8", action="store_true", help="use the int8 graphs (export.int8: true)")
    p.add_argument("--host", default=default["host"], help="address to bind (default: %(default)s; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=default["port"], help="port (default: %(default)s; 0: any free one)")
    p.add_argument("--workers", type=int, default=default["workers"],
                   help="batches decoded at once, one CPU thread each (default: %(default)s)")
    p.add_argument("--beam", type=int, default=None, help="beam size; 1 is greedy (default: the export's)")
    p.add_argument("--max-batch-tokens", type=int, default=default["max_batch_tokens"],
                   help="source tokens that make a batch full (default: %(default)s)")
    p.add_argument("--max-wait-ms", type=float, default=default["max_wait_ms"],
                   help="longest a line waits for others to share its batch (default: %(default)s)")
    p.add_argument("--max-lines", type=int, default=default["max_lines"],
                   help="lines per request, line breaks included (default: %(default)s)")
    p.add_argument("--max-line-tokens", type=int, default=None,
                   help="source tokens per line (default: the model's positions)")
    p.add_argument("--max-request-bytes", type=int, default=default["max_request_bytes"],
                   help="request body size (default: %(default)s)")
    p.add_argument("--max-queued-lines", type=int, default=default["max_queued_lines"],
                   help="lines waiting across requests before new ones get 503 (default: %(default)s)")
    p.add_argument("--request-timeout-s", type=float, default=default["request_timeout_s"],
                   help="deadline of a request; past it, 504 and its work is dropped (default: %(default)s)")
    p.add_argument("--header-timeout-s", type=float, default=default["header_timeout_s"],
                   help="from a connection's start or its last response to a complete request head; past it, 408 "
                   "and closed (default: %(default)s)")
    p.add_argument("--body-timeout-s", type=float, default=default["body_timeout_s"],
                   help="from a request's head to the end of its body; past it, 408 and closed (default: %(default)s)")
    p.add_argument("--max-connections", type=int, default=default["max_connections"],
                   help="open connections; one more is answered 503 and closed (default: %(default)s)")
    p.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")


def serve_command(args: argparse.Namespace) -> int:
    import logging

    from pipeline.runtime.errors import PipelineError
    from pipeline.runtime.serve.settings import SETTING_NAMES, ServeSettings

    logging.basicConfig(level=logging.INFO, format="mtpipe serve: %(levelname)s: %(message)s")
    try:
        settings = ServeSettings(**{**{name: getattr(args, name) for name in SETTING_NAMES},
                                    "model_dir": Path(args.model_dir)})
        from pipeline.runtime.serve.server import serve

        serve(settings)
    except PipelineError as err:
        print(f"mtpipe serve: {err}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in ("fastapi", "starlette", "uvicorn", "prometheus_client"):
            print(f"mtpipe serve: {err.name} is not installed: pip install -e '.[serve]'", file=sys.stderr)
            return 2
        raise
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtpipe", description="Reproducible MT training pipeline over one DVC DAG.")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="dvc repro, then print the summary")
    run_p.add_argument("--force", action="store_true", help="rerun every stage (dvc repro --force)")
    sub.add_parser("summary", help="test scores, training and export figures, where each artifact and page is")
    _add_plots_parser(sub)
    params_p = sub.add_parser("params", help="validate params.yaml and print the effective settings")
    params_p.add_argument("file", nargs="?", default="params.yaml")
    stage_p = sub.add_parser("stage", help="run one stage directly, outside DVC")
    stage_p.add_argument("name", choices=STAGES + STUDENT_STAGES)
    _add_flow_parser(sub)
    _add_translate_parser(sub)
    _add_serve_parser(sub)
    return parser


def params_command(file: str) -> int:
    try:
        params = load(file)
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    effective = params.model_dump(by_alias=True)
    effective["model"]["architecture"] = params.model.architecture()
    print(json.dumps(effective, indent=2))
    return 0


def run_command(force: bool, paths: Paths) -> int:
    try:
        load("params.yaml")  # fail on bad params before DVC starts anything
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    ensure_dvc_repo(paths.root)
    # Stage commands run `python -m stages.<name>`: put this environment's bin first so they use it.
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run([*_dvc(), "repro", *(["--force"] if force else [])], env=env)
    if result.returncode != 0:
        return result.returncode
    print()
    print(summary(paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    paths = Paths()
    if args.command == "flow":
        return flow_command(args)
    if args.command == "params":
        return params_command(args.file)
    if args.command == "summary":
        print(summary(paths))
        return 0
    if args.command == "plots":
        return plots_command(args, paths)
    if args.command == "stage":
        return subprocess.run(stage_command(args.name)).returncode
    if args.command == "translate":
        return translate(args)
    if args.command == "serve":
        return serve_command(args)
    return run_command(args.force, paths)


if __name__ == "__main__":
    sys.exit(main())
