"""`mtpipe`: the command line. It starts fast: no heavy library is imported until a subcommand needs it.

  mtpipe run            dvc repro (initialising DVC first if needed), then the summary
  mtpipe summary        test BLEU/chrF and where each artifact is
  mtpipe params         validate params.yaml and print the effective settings (presets resolved)
  mtpipe stage NAME     run one stage directly, outside DVC (for debugging)
  mtpipe flow ...       Prefect: run the pipeline flow once, run an experiment, serve the deployments
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.artifacts import Paths
from pipeline.params import ParamsError, load

STAGES = ("download", "clean", "validate", "tokenize", "train", "evaluate", "export")


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


def summary(paths: Paths) -> str:
    lines = []
    eval_file = paths.metrics("eval")
    if eval_file.exists():
        lines.append("Test scores (sacreBLEU, cased, 13a):")
        for split, r in json.loads(eval_file.read_text()).items():
            lines.append(f"  {split:<20} BLEU {r['bleu']:6.2f}   chrF {r['chrf']:6.2f}   ({r['sentences']} sentences)")
        first = next(iter(json.loads(eval_file.read_text()).values()))
        lines.append(f"  signature: {first['signature']['bleu']}")
    else:
        lines.append("No evaluation yet: run `mtpipe run` (or `dvc repro`).")
    artifacts = [
        ("raw corpus", paths.raw),
        ("clean corpus + rejected rows", paths.clean),
        ("validation report (Data Docs)", paths.validation_report / "index.html"),
        ("SentencePiece model + encoded arrays", paths.tokenized),
        ("trained model (save_pretrained)", paths.final_model),
        ("training curves (DVCLive)", paths.dvclive),
        ("hypotheses", paths.eval_dir),
        ("ONNX + TorchScript export", paths.export),
        ("metrics", paths.root / "metrics"),
    ]
    lines.append("Artifacts:")
    for label, path in artifacts:
        state = "" if path.exists() else "  (missing)"
        lines.append(f"  {label:<38} {path}{state}")
    return "\n".join(lines)


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
        from pipeline import flow
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
        "stay empty) with the ONNX graphs of an export directory, on ONNX Runtime.",
    )
    tr_p.add_argument("--model", default=str(Paths().export), help="export directory (default: %(default)s)")
    tr_p.add_argument("--beam", type=int, default=None, help="beam size; 1 is greedy (default: the export's)")
    tr_p.add_argument("--length-penalty", type=float, default=None, help="default: the export's")
    tr_p.add_argument("--int8", action="store_true", help="use the int8 graphs (export.int8: true)")
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

    from pipeline.errors import PipelineError
    from pipeline.translate import Translator, read_lines

    logging.basicConfig(level=logging.WARNING, format="mtpipe translate: %(levelname)s: %(message)s")
    try:
        if args.beam is not None and args.beam < 1:
            raise PipelineError(f"--beam must be at least 1, got {args.beam}")
        if args.threads < 1:
            raise PipelineError(f"--threads must be at least 1, got {args.threads}")
        lines = read_lines(sys.stdin.buffer)
        translator = Translator(args.model, int8=args.int8, threads=args.threads, max_tokens=args.max_tokens)
        beam = args.beam or translator.manifest.get("generation", {}).get("beam", 4)
        out = translator.translate(lines, beam=beam, length_penalty=args.length_penalty)
    except PipelineError as err:
        print(f"mtpipe translate: {err}", file=sys.stderr)
        return 1
    # Bytes, so the output is UTF-8 whatever the locale says.
    sys.stdout.buffer.write("".join(line + "\n" for line in out).encode("utf-8"))
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtpipe", description="Reproducible MT training pipeline over one DVC DAG.")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="dvc repro, then print the summary")
    run_p.add_argument("--force", action="store_true", help="rerun every stage (dvc repro --force)")
    sub.add_parser("summary", help="test scores and where each artifact is")
    params_p = sub.add_parser("params", help="validate params.yaml and print the effective settings")
    params_p.add_argument("file", nargs="?", default="params.yaml")
    stage_p = sub.add_parser("stage", help="run one stage directly, outside DVC")
    stage_p.add_argument("name", choices=STAGES)
    _add_flow_parser(sub)
    _add_translate_parser(sub)
    args = parser.parse_args(argv)
    paths = Paths()

    if args.command == "flow":
        return flow_command(args)

    if args.command == "params":
        try:
            params = load(args.file)
        except ParamsError as err:
            print(err, file=sys.stderr)
            return 2
        effective = params.model_dump(by_alias=True)
        effective["model"]["architecture"] = params.model.architecture()
        print(json.dumps(effective, indent=2))
        return 0
    if args.command == "summary":
        print(summary(paths))
        return 0
    if args.command == "stage":
        return subprocess.run([sys.executable, "-m", f"stages.{args.name}"]).returncode
    if args.command == "translate":
        return translate(args)
    # run
    try:
        load("params.yaml")  # fail on bad params before DVC starts anything
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    ensure_dvc_repo(paths.root)
    # Stage commands run `python -m stages.<name>`: put this environment's bin first so they use it.
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run([*_dvc(), "repro", *(["--force"] if args.force else [])], env=env)
    if result.returncode != 0:
        return result.returncode
    print()
    print(summary(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
