"""Prefect over the DVC DAG: schedules, retries, logs and experiment reports; DVC keeps the DAG and the cache.

`dvc.yaml` stays the only description of the pipeline. The `pipeline` flow asks DVC for the stage graph, then runs
each stage as a Prefect task through `dvc repro --single-item <stage>` in dependency order, so DVC alone decides
whether a stage reruns, is skipped, or is restored from its run-cache. Prefect result caching is off for the same
reason: a second cache would disagree with DVC's. The `experiment` flow wraps `dvc exp run -S ...` and publishes
the experiment's scores as a markdown artifact. `prefect.yaml` declares the deployments (`nightly`,
`experiment`); `serve_deployments` serves them from this process, `prefect deploy` sends them to a work pool.

Prefect is imported here and only here, so `mtpipe` itself starts without it.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prefect import Flow, flow, get_run_logger, serve, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.schedules import Cron
from prefect.tasks import Task, exponential_backoff
from prefect.types.entrypoint import EntrypointType

from pipeline.artifacts import Paths
from pipeline.run_figures import evaluation_of

# Stages that reach the network (a dataset hub, a remote corpus) get retries; the rest either succeed or fail the
# same way every time, and a retry would only hide the error.
RETRIED_STAGES = frozenset({"download"})
DOWNLOAD_RETRIES = 3
DOWNLOAD_BACKOFF_SECONDS = 30.0  # then 60 s, 120 s
ERROR_TAIL_LINES = 12


class StageFailed(RuntimeError):
    """A DVC stage exited non-zero; the message carries the stage's own error lines."""

    def __init__(self, stage: str, returncode: int, error_lines: Sequence[str]) -> None:
        self.stage = stage
        self.returncode = returncode
        self.error_lines = list(error_lines)
        super().__init__(f"stage '{stage}' failed (dvc exit {returncode}):\n" + "\n".join(self.error_lines))


class ExperimentFailed(RuntimeError):
    """`dvc exp run` exited non-zero."""


# ---------------------------------------------------------------------------------------------------------------
# The DAG, as DVC sees it


def read_stage_graph(project_dir: str | Path) -> dict[str, list[str]]:
    """Each pipeline stage mapped to the stages it depends on, from DVC's own index (dvc.yaml order kept)."""
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    with warnings.catch_warnings(), Repo(str(project_dir)) as repo:
        warnings.simplefilter("ignore", DeprecationWarning)  # DVC's own use of a deprecated pygtrie API
        index = repo.index
        stages = [s for s in index.stages if isinstance(s, PipelineStage)]

        def address(stage: PipelineStage) -> str:
            # What `dvc repro` accepts when run from the project root (DVC's own `addressing` is cwd-relative).
            dvcfile = Path(os.path.relpath(stage.path, repo.root_dir)).as_posix()
            return stage.name if dvcfile == "dvc.yaml" else f"{dvcfile}:{stage.name}"

        position = {address(s): i for i, s in enumerate(stages)}
        # DVC's graph points from a stage to the stages whose outputs it reads.
        return {
            address(s): sorted(
                (address(up) for up in index.graph.successors(s) if isinstance(up, PipelineStage)),
                key=position.__getitem__,
            )
            for s in stages
        }


def stage_order(upstream: Mapping[str, Sequence[str]]) -> list[str]:
    """A topological order of the stages; among stages ready at the same time, the one declared first goes first."""
    unknown = {u for ups in upstream.values() for u in ups} - set(upstream)
    if unknown:
        raise ValueError(f"stages depend on unknown stages: {sorted(unknown)}")
    remaining = {stage: set(ups) for stage, ups in upstream.items()}
    order: list[str] = []
    while remaining:
        ready = [stage for stage, ups in remaining.items() if not ups]
        if not ready:
            raise ValueError(f"the stage graph has a cycle among: {sorted(remaining)}")
        stage = ready[0]  # dicts keep declaration order
        order.append(stage)
        del remaining[stage]
        for ups in remaining.values():
            ups.discard(stage)
    return order


# ---------------------------------------------------------------------------------------------------------------
# Running DVC with its output streamed line by line


@dataclass
class CommandOutput:
    returncode: int
    lines: list[str] = field(default_factory=list)

    def error_lines(self) -> list[str]:
        """What went wrong: from the first error line on (its detail often follows it), else the last lines."""
        first = next((i for i, line in enumerate(self.lines) if _is_error(line)), None)
        if first is None:
            return self.lines[-ERROR_TAIL_LINES:]
        block = self.lines[first:]
        if len(block) <= ERROR_TAIL_LINES:
            return block
        half = ERROR_TAIL_LINES // 2
        return [*block[:half], "...", *block[-half:]]


def dvc_executable() -> str:
    """The dvc of this interpreter's environment, so flows work without an activated venv."""
    local = Path(sys.executable).with_name("dvc")
    return str(local) if local.exists() else "dvc"


def _subprocess_env() -> dict[str, str]:
    # Stage commands are `python -m stages.<name>`: this environment's bin goes first so they use its python.
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "DVC_NO_ANALYTICS": "1",
        "PYTHONUNBUFFERED": "1",  # lines reach the log as they are printed, not when a buffer fills
    }


def _is_error(line: str) -> bool:
    return re.search(r"\b(ERROR|Traceback|Error:)", line) is not None


def run_streamed(args: Sequence[str], cwd: str | Path, log: Callable[[str], None]) -> CommandOutput:
    """Run a command, handing each line of its stdout and stderr to `log` as soon as it is printed."""
    output = CommandOutput(returncode=-1)
    with subprocess.Popen(
        list(args), cwd=cwd, env=_subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, encoding="utf-8", errors="replace", bufsize=1,
    ) as process:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.rstrip("\n").rsplit("\r", 1)[-1].rstrip()  # a progress bar's last redraw only
            if line:
                output.lines.append(line)
                log(line)
        output.returncode = process.wait()
    return output


def _log_line(line: str) -> None:
    logger = get_run_logger()
    if _is_error(line):
        logger.error(line)
    elif "WARNING" in line:
        logger.warning(line)
    else:
        logger.info(line)


def stage_outcome(stage: str, lines: Sequence[str]) -> str:
    """What DVC did with the stage: `ran`, `skipped` (unchanged), or `restored` (from its run-cache)."""
    text = "\n".join(lines)
    if f"Running stage '{stage}'" in text:
        return "ran"
    if f"Stage '{stage}' is cached - skipping run" in text:
        return "restored"
    if f"Stage '{stage}' didn't change, skipping" in text:
        return "skipped"
    return "unknown"


# ---------------------------------------------------------------------------------------------------------------
# Tasks and flows


@task(name="dvc-stage", cache_policy=NO_CACHE, persist_result=False)
def run_stage(project_dir: str, stage: str) -> str:
    """`dvc repro --single-item <stage>`: upstream stages already ran, so DVC checks only this one."""
    result = run_streamed([dvc_executable(), "repro", "--single-item", stage], project_dir, _log_line)
    if result.returncode != 0:
        raise StageFailed(stage, result.returncode, result.error_lines())
    outcome = stage_outcome(stage, result.lines)
    get_run_logger().info("stage %s: %s", stage, outcome)
    return outcome


def stage_task(stage: str) -> Task[..., str]:
    """The task for one stage, named after it; only network-facing stages retry, with exponential backoff."""
    retry: dict[str, Any] = {}
    if stage in RETRIED_STAGES:
        retry = {
            "retries": DOWNLOAD_RETRIES,
            "retry_delay_seconds": exponential_backoff(backoff_factor=DOWNLOAD_BACKOFF_SECONDS),
            "retry_jitter_factor": 0.2,
        }
    return run_stage.with_options(task_run_name=stage, **retry)


def default_remote(project_dir: str | Path) -> str | None:
    """The name of the default DVC remote, or None when none is configured."""
    result = subprocess.run(
        [dvc_executable(), "remote", "default"], cwd=project_dir, env=_subprocess_env(),
        capture_output=True, text=True,
    )
    name = result.stdout.strip()
    return name if result.returncode == 0 and name else None


@task(name="dvc-push", cache_policy=NO_CACHE, persist_result=False)
def push_to_remote(project_dir: str) -> str | None:
    """`dvc push` to the default remote, so another machine can `dvc pull` what this run produced."""
    logger = get_run_logger()
    remote = default_remote(project_dir)
    if remote is None:
        logger.warning(
            "No default DVC remote configured: skipping `dvc push`, artifacts stay in this machine's cache. "
            "Add one with `dvc remote add -d storage s3://<bucket>/<path>` (or gs://, a directory, ...)."
        )
        return None
    result = run_streamed([dvc_executable(), "push"], project_dir, _log_line)
    if result.returncode != 0:
        raise RuntimeError(f"dvc push to '{remote}' failed (exit {result.returncode}):\n"
                           + "\n".join(result.error_lines()))
    logger.info("pushed to DVC remote '%s'", remote)
    return remote


@flow(name="mt-pipeline", persist_result=False)
def pipeline(project_dir: str = ".", push: bool = False) -> dict[str, str]:
    """Every dvc.yaml stage as a task, in DVC's DAG order; with `push`, ends with `dvc push`."""
    logger = get_run_logger()
    root = str(Path(project_dir).resolve())
    order = stage_order(read_stage_graph(root))
    logger.info("DAG from DVC: %s", " -> ".join(order))
    # One stage at a time: DVC locks the project while it reproduces a stage.
    outcomes = {stage: stage_task(stage)(root, stage) for stage in order}
    logger.info("stages: %s", ", ".join(f"{stage}={outcome}" for stage, outcome in outcomes.items()))
    if push:
        push_to_remote(root)
    return outcomes


# ---------------------------------------------------------------------------------------------------------------
# Experiments


def format_override(key: str, value: Any) -> str:
    """One `-S key=value` argument; values written so DVC parses them back to the same type."""
    if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)+", key):
        raise ValueError(f"override key {key!r} must be section.name (e.g. train.lr)")
    if isinstance(value, str):
        text = value if re.fullmatch(r"[\w./-]+", value) and yaml.safe_load(value) == value else (
            "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'")
    elif value is None or isinstance(value, (bool, int, float, list)):
        text = json.dumps(value)
    else:
        raise ValueError(f"override {key}: unsupported value {value!r} (use a number, string, bool, null or list)")
    return f"{key}={text}"


def exp_run_args(overrides: Mapping[str, Any], name: str | None) -> list[str]:
    args = ["exp", "run", "--temp"]
    for key, value in overrides.items():
        # `++`: set the key whether or not params.yaml spells it out (the schema gives every key a default).
        args += ["-S", "++" + format_override(key, value)]
    if name:
        args += ["-n", name]
    return args


def experiment_name(lines: Sequence[str]) -> str | None:
    """The name DVC gave the experiment (`Ran experiment(s): <name>`)."""
    for line in reversed(lines):
        found = re.search(r"Ran experiment\(s\): (\S+)", line)
        if found:
            return found.group(1)
    return None


@dataclass(frozen=True)
class ExperimentReport:
    name: str
    overrides: dict[str, Any]
    scores: dict[str, dict[str, float]]  # test set -> {"bleu": ..., "chrf": ...}
    tgt_tokens_per_s: float | None
    train_seconds: float | None
    wall_seconds: float

    def markdown(self) -> str:
        lines = [f"# Experiment `{self.name}`", ""]
        changed = ", ".join(f"`{format_override(k, v)}`" for k, v in self.overrides.items()) or "none"
        lines += [f"Overrides: {changed}", "", "| test set | BLEU | chrF |", "|---|---:|---:|"]
        lines += [f"| {split} | {s['bleu']:.2f} | {s['chrf']:.2f} |" for split, s in self.scores.items()]
        speed = f"{self.tgt_tokens_per_s:,.1f}" if self.tgt_tokens_per_s is not None else "n/a"
        train = f"{self.train_seconds:.1f} s" if self.train_seconds is not None else "n/a"
        lines += ["", f"- train throughput: {speed} target tokens/s (training time {train})",
                  f"- experiment wall time (`dvc exp run`): {self.wall_seconds:.1f} s"]
        return "\n".join(lines) + "\n"


def experiment_metrics(exp_show: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The metrics of one named experiment, as `dvc exp show --json` reports them (path -> content)."""
    for baseline in exp_show:
        for group in baseline.get("experiments") or []:
            for rev in group.get("revs") or []:
                if rev.get("name") == name:
                    metrics = (rev.get("data") or {}).get("metrics") or {}
                    return {path: entry.get("data", {}) for path, entry in metrics.items()}
    raise KeyError(f"experiment {name!r} not found in `dvc exp show`")


def experiment_report(name: str, overrides: Mapping[str, Any], metrics: Mapping[str, Any],
                      wall_seconds: float) -> ExperimentReport:
    paths = Paths(Path("."))
    evaluation = metrics.get(str(paths.metrics("eval")), {})
    training = metrics.get(str(paths.metrics("train")), {})
    # One row per (test set, direction), labelled as the summary and the card label them ("test en-de").
    scores = {r.label: {"bleu": r.bleu, "chrf": r.chrf} for r in evaluation_of(evaluation).scored}
    speed = training.get("tgt_tokens_per_s")
    seconds = training.get("train_seconds", training.get("wall_seconds"))
    return ExperimentReport(
        name=name, overrides=dict(overrides), scores=scores,
        tgt_tokens_per_s=float(speed) if speed is not None else None,
        train_seconds=float(seconds) if seconds is not None else None, wall_seconds=wall_seconds,
    )


def artifact_key(name: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    return "experiment-" + (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unnamed")


@task(name="dvc-exp-run", cache_policy=NO_CACHE, persist_result=False)
def run_experiment(project_dir: str, overrides: dict[str, Any], name: str | None) -> tuple[str, float]:
    """`dvc exp run --temp -S ...`: a temporary copy, so the workspace (and the next nightly) keeps its params."""
    start = time.perf_counter()
    result = run_streamed([dvc_executable(), *exp_run_args(overrides, name)], project_dir, _log_line)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise ExperimentFailed(f"dvc exp run failed (exit {result.returncode}):\n" + "\n".join(result.error_lines()))
    ran = experiment_name(result.lines) or name
    if not ran:
        raise ExperimentFailed("dvc exp run succeeded but did not name the experiment")
    return ran, seconds


@flow(name="mt-experiment", persist_result=False)
def experiment(overrides: dict[str, Any], name: str | None = None, project_dir: str = ".") -> dict[str, Any]:
    """Run one experiment from the last commit with params overrides; publish its scores as a markdown artifact."""
    logger = get_run_logger()
    root = str(Path(project_dir).resolve())
    ran, seconds = run_experiment(root, overrides, name)
    shown = subprocess.run([dvc_executable(), "exp", "show", "--json"], cwd=root, env=_subprocess_env(),
                           capture_output=True, text=True, check=True)
    report = experiment_report(ran, overrides, experiment_metrics(json.loads(shown.stdout), ran), seconds)
    create_markdown_artifact(key=artifact_key(ran), markdown=report.markdown(),
                             description=f"dvc experiment {ran}: scores, throughput, wall time")
    logger.info("experiment %s: %s", ran, json.dumps(report.scores))
    return {"name": ran, "scores": report.scores, "tgt_tokens_per_s": report.tgt_tokens_per_s,
            "wall_seconds": round(seconds, 1)}


# ---------------------------------------------------------------------------------------------------------------
# Deployments: declared once in prefect.yaml, served from here or sent to a work pool by `prefect deploy`


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    entrypoint: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    crons: tuple[tuple[str, str | None], ...] = ()  # (cron, timezone)
    tags: tuple[str, ...] = ()


def load_deployment_specs(prefect_file: str | Path) -> list[DeploymentSpec]:
    """The deployments of a prefect.yaml (only the fields serving needs; work pools are for `prefect deploy`)."""
    config = yaml.safe_load(Path(prefect_file).read_text()) or {}
    specs = []
    for entry in config.get("deployments") or []:
        crons = tuple(
            (schedule["cron"], schedule.get("timezone"))
            for schedule in entry.get("schedules") or []
            if schedule.get("cron") and schedule.get("active", True)
        )
        specs.append(DeploymentSpec(
            name=entry["name"], entrypoint=entry["entrypoint"], description=entry.get("description") or "",
            parameters=dict(entry.get("parameters") or {}), crons=crons, tags=tuple(entry.get("tags") or ()),
        ))
    if not specs:
        raise ValueError(f"{prefect_file}: no deployments declared")
    return specs


def load_flow(entrypoint: str) -> Flow[..., Any]:
    """A flow from a module-path entrypoint (`pipeline.tools.flow.pipeline`), imported from the installed package."""
    module_name, _, attribute = entrypoint.rpartition(".")
    if ":" in entrypoint or not module_name:
        raise ValueError(f"entrypoint {entrypoint!r}: use a module path such as pipeline.tools.flow.pipeline")
    found = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(found, Flow):
        raise ValueError(f"entrypoint {entrypoint!r} is not a Prefect flow")
    return found


def serve_deployments(project_dir: str | Path = ".", prefect_file: str | Path | None = None) -> None:
    """Register prefect.yaml's deployments and run their flow runs here, one at a time (DVC locks the repo)."""
    root = Path(project_dir).resolve()
    specs = load_deployment_specs(prefect_file or root / "prefect.yaml")
    deployments = [
        load_flow(spec.entrypoint).to_deployment(
            name=spec.name,
            description=spec.description or None,
            schedules=[Cron(cron, timezone=tz) for cron, tz in spec.crons],
            parameters={**spec.parameters, "project_dir": str(root)},
            tags=list(spec.tags),
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        for spec in specs
    ]
    serve(*deployments, limit=1)
