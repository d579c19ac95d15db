"""Prefect over the real DAG, through a real Prefect server on 127.0.0.1.

One server, one runner (`mtpipe flow serve`) and one temporary git + DVC copy of the project serve the whole module:
the `nightly` deployment runs every stage in DVC's order and pushes to a local DVC remote; triggered again it finds
nothing to do; a broken param fails it with the stage's own message; the `experiment` deployment publishes its
scores; a fresh clone pulls the pushed artifacts; and an independent `dvc repro` reproduces the Prefect run's
dvc.lock. Processes are started in their own sessions and stopped by PID at teardown.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.tools import flow as mtflow
from tests.e2e.helpers import BIN, dvc, git, project_copy, set_params

pytestmark = pytest.mark.e2e

# The real DAG at its smallest. A barely trained model writes until the length limit: greedy decoding with a tight
# limit (and no BLEU during training) keeps the decoding parts to seconds. One training thread: the reference
# `dvc repro` trains at the same time, and two trainings with two threads each on two cores crawl.
FAST = {
    "model": {"preset": "tiny"},
    "train": {"max_steps": 40, "valid_every": 40, "valid_bleu_sentences": 0, "log_every": 10, "max_minutes": 10,
              "threads": 1},
    "evaluate": {"beam": 1, "max_len_a": 0.5, "max_len_b": 8},
    "export": {"parity_sentences": 16, "int8": False},
}
NIGHTLY = "mt-pipeline/nightly"
EXPERIMENT = "mt-experiment/experiment"
RUN_TIMEOUT_S = 1200
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}


# ---------------------------------------------------------------------------------------------------------------
# Processes


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **GIT_IDENTITY, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **extra}


def _start(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    # Own session: its PID is also its process group, so teardown stops it and everything it started.
    with open(log, "wb") as out:
        return subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what}: process exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if condition():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what}: not ready after {timeout:.0f}s:\n{log.read_text()[-4000:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------------------
# Fixtures: one project, one reference `dvc repro`, one server, one runner, one first nightly


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = project_copy(tmp_path_factory.mktemp("project"))
    set_params(root, FAST)
    dvc(root, "remote", "add", "-d", "storage", str(tmp_path_factory.mktemp("dvc_remote")))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "fast params, local DVC remote")
    return root


@pytest.fixture(scope="module")
def reference_repro(project, tmp_path_factory) -> Iterator[Callable[[], Path]]:
    """`dvc repro` in an independent clone (own cache, own directory), started early to overlap the Prefect runs."""
    clone = tmp_path_factory.mktemp("reference") / "clone"
    git(project, "clone", "-q", str(project), str(clone))
    log = clone.parent / "repro.log"
    process = _start([str(BIN / "dvc"), "repro"], clone, _env(), log)

    def finished() -> Path:
        assert process.wait(timeout=RUN_TIMEOUT_S) == 0, log.read_text()[-4000:]
        return clone

    yield finished
    _stop(process)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A real `prefect server` on a free port, its database in a temporary PREFECT_HOME; this process talks to it."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings

    home = tmp_path_factory.mktemp("prefect_home")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = _env(PREFECT_HOME=str(home), PREFECT_API_URL=url, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    log = home / "server.log"
    server = _start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                    home, env, log)
    try:
        _wait_for(lambda: urllib.request.urlopen(f"{url}/health", timeout=5).status == 200,
                  "prefect server health", server, log, timeout=240)
        with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_HOME: home,
                                         PREFECT_SERVER_ANALYTICS_ENABLED: False}):
            yield env
    finally:
        _stop(server)


@pytest.fixture(scope="module")
def served(prefect_server, project) -> Iterator[None]:
    """`mtpipe flow serve` in the project: registers prefect.yaml's deployments and runs their flow runs."""
    from prefect.client.orchestration import get_client

    log = project.parent / "runner.log"
    runner = _start([str(BIN / "mtpipe"), "flow", "serve"], project,
                    {**prefect_server, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}, log)

    def registered() -> bool:
        with get_client(sync_client=True) as client:
            return all(client.read_deployment_by_name(name) for name in (NIGHTLY, EXPERIMENT))

    try:
        _wait_for(registered, "deployments served", runner, log, timeout=240)
        yield
    finally:
        _stop(runner)


@pytest.fixture(scope="module")
def first_nightly(reference_repro, served, project) -> Any:
    run = trigger(NIGHTLY)
    commit_results(project, "nightly results")
    return run


def commit_results(root: Path, message: str) -> None:
    """What a nightly job commits: dvc.lock, DVC's .gitignore files, and the metrics and plots dvc.yaml declares
    (they live in git); data and models went to the DVC remote."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    declared = [next(iter(entry)) if isinstance(entry, dict) else entry
                for spec in stages.values() for entry in spec.get("metrics", []) + spec.get("plots", [])]
    ignores = [p.relative_to(root).as_posix() for p in root.rglob(".gitignore") if ".dvc" not in p.parts]
    git(root, "add", "dvc.lock", *ignores, *[path for path in declared if (root / path).exists()])
    git(root, "commit", "-qm", message)


# ---------------------------------------------------------------------------------------------------------------
# Reading runs back from the API


def trigger(deployment: str, parameters: dict[str, Any] | None = None) -> Any:
    from prefect.deployments import run_deployment

    run = run_deployment(deployment, parameters=parameters, timeout=RUN_TIMEOUT_S, poll_interval=1)
    assert run.state is not None and run.state.is_final(), f"{deployment} did not finish: {run.state}"
    return run


def task_runs(flow_run_id) -> list[Any]:
    """The flow run's task runs in the order they started."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(runs, key=lambda r: r.start_time or r.expected_start_time)


def logs(flow_run_id) -> list[Any]:
    """Every log line of the flow run, once the engine's last line ("Finished in state ...") has arrived."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            found: list[Any] = []
            while page := client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                           limit=200, offset=len(found)):
                found += page
            flow_finished = any(log.task_run_id is None and log.message.startswith("Finished in state")
                                for log in found)
            if flow_finished or time.monotonic() > deadline:
                return found
            time.sleep(0.5)


def task_logs(all_logs: list[Any], task_run) -> list[str]:
    return [log.message for log in all_logs if log.task_run_id == task_run.id]


def stage_runs(flow_run_id) -> list[Any]:
    return [r for r in task_runs(flow_run_id) if r.task_key.startswith("run_stage")]


# ---------------------------------------------------------------------------------------------------------------
# The nightly deployment


def test_nightly_runs_every_stage_through_dvc_in_dag_order_and_pushes(first_nightly, project):
    assert first_nightly.state.is_completed(), first_nightly.state
    dag_order = mtflow.stage_order(mtflow.read_stage_graph(project))
    declared = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    assert set(dag_order) == set(declared)

    runs = task_runs(first_nightly.id)
    stages = [r for r in runs if r.task_key.startswith("run_stage")]
    assert [r.name for r in stages] == dag_order
    assert all(r.state.is_completed() for r in runs)
    for earlier, later in zip(stages, stages[1:], strict=False):
        assert earlier.end_time <= later.start_time, (earlier.name, later.name)  # one after the other

    all_logs = logs(first_nightly.id)
    for run in stages:
        lines = task_logs(all_logs, run)
        assert f"Running stage '{run.name}':" in lines, run.name  # DVC ran it
        assert f"> {declared[run.name]['cmd']}" in lines, run.name  # the student's: python -m stages.<x> --student
        assert f"stage {run.name}: ran" in lines
    # Streamed: train's lines reached Prefect over the seconds it ran, not in one burst at the end.
    train_times = [log.timestamp for log in all_logs if log.task_run_id == stages[dag_order.index("train")].id]
    assert (max(train_times) - min(train_times)).total_seconds() > 2

    push = [r for r in runs if r.task_key.startswith("push_to_remote")]
    assert len(push) == 1 and push[0].start_time >= stages[-1].end_time  # the nightly ends with the push
    assert "pushed to DVC remote 'storage'" in task_logs(all_logs, push[0])
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    assert set(lock["stages"]) == set(dag_order)


def test_nightly_again_with_nothing_changed_lets_dvc_skip_every_stage(first_nightly, project):
    run = trigger(NIGHTLY)
    assert run.state.is_completed(), run.state
    all_logs = logs(run.id)
    stages = stage_runs(run.id)
    assert [r.name for r in stages] == [r.name for r in stage_runs(first_nightly.id)]
    for stage in stages:
        lines = task_logs(all_logs, stage)
        assert f"Stage '{stage.name}' didn't change, skipping" in lines, (stage.name, lines)
        assert not any(line.startswith("Running stage") for line in lines), stage.name
        assert f"stage {stage.name}: skipped" in lines


def test_a_broken_param_fails_the_run_with_that_stages_error_in_its_logs(first_nightly, project):
    set_params(project, {"train": {"lr": -1}})
    try:
        run = trigger(NIGHTLY)
    finally:
        # Restore params (and any output DVC removed before the failed stage ran) for the next tests.
        git(project, "checkout", "--", ".")
        dvc(project, "checkout")
    assert run.state.is_failed(), run.state
    # The params check is the DAG's first stage: it fails before any stage works (or DVC removes its outputs).
    assert "stage 'check_params' failed" in (run.state.message or "")

    stages = {r.name: r for r in stage_runs(run.id)}
    assert list(stages) == ["check_params"]  # nothing after the failure
    assert stages["check_params"].state.is_failed()
    assert not [r for r in task_runs(run.id) if r.task_key.startswith("push_to_remote")]

    assert "train.lr = -1" in run.state.message  # the stage's own words, in the flow run's state

    check_logs = [log for log in logs(run.id) if log.task_run_id == stages["check_params"].id]
    errors = [log.message for log in check_logs if log.level >= 40]  # ERROR
    assert any("check_params failed" in line for line in errors), errors
    assert any("failed to reproduce 'check_params'" in line for line in errors), errors
    assert any("train.lr = -1" in log.message for log in check_logs)


# ---------------------------------------------------------------------------------------------------------------
# The experiment deployment


def test_experiment_publishes_name_scores_speed_and_wall_time_as_a_markdown_artifact(first_nightly, project):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    workspace_evaluate = yaml.safe_load((project / "params.yaml").read_text())["evaluate"]
    assert workspace_evaluate["max_tokens"] != 500
    run = trigger(EXPERIMENT, {"overrides": {"evaluate.max_tokens": 500}, "name": "eval-batch-500"})
    assert run.state.is_completed(), run.state

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    assert [(a.key, a.type) for a in artifacts] == [("experiment-eval-batch-500", "markdown")]
    markdown = artifacts[0].data

    shown = json.loads(dvc(project, "exp", "show", "--json").stdout)
    metrics = mtflow.experiment_metrics(shown, "eval-batch-500")
    scores = metrics["metrics/eval.json"]
    assert scores and "# Experiment `eval-batch-500`" in markdown and "`evaluate.max_tokens=500`" in markdown
    for split, per_direction in scores.items():
        if split == "macro":
            continue
        for direction, result in per_direction.items():
            assert f"| {split} {direction} | {result['bleu']:.2f} | {result['chrf']:.2f} |" in markdown
    speed = metrics["metrics/train.json"]["tgt_tokens_per_s"]
    assert f"{speed:,.1f} target tokens/s" in markdown
    assert re.search(r"experiment wall time \(`dvc exp run`\): \d+\.\d s", markdown)

    # DVC ran the experiment in a temporary copy, its output in the run's logs; the workspace keeps its params.
    lines = [log.message for log in logs(run.id)]
    assert "Running stage 'evaluate':" in lines and "Ran experiment(s): eval-batch-500" in lines
    assert "Stage 'tokenize' didn't change, skipping" in lines
    assert yaml.safe_load((project / "params.yaml").read_text())["evaluate"] == workspace_evaluate


# ---------------------------------------------------------------------------------------------------------------
# Artifacts travel; Prefect and `dvc repro` agree


def test_a_fresh_clone_pulls_what_the_nightly_pushed_and_is_up_to_date(first_nightly, project, tmp_path):
    clone = tmp_path / "clone"
    git(project, "clone", "-q", str(project), str(clone))
    assert not (clone / "models/final").exists()
    dvc(clone, "pull")
    assert (clone / "models/final/config.json").exists()
    status = dvc(clone, "status")
    assert status.stdout.strip().startswith("Data and pipelines are up to date"), status.stdout


# Two runs in two checkouts write different bytes to some outputs. Each known cause, checked file by file below:
#  - measurements of the run itself: timings, throughput and CPU/memory use, in metrics files, in
#    models/export/export.json and in the training checkpoints' progress history;
#  - absolute paths: the download manifest records the project path of each source file, the ONNX exporter keeps
#    Python stack traces and TorchScript keeps debug source locations, both with the path of stages/export/;
#  - Great Expectations Data Docs are stamped with each validation run's time, id and temporary batch path;
#  - the training checkpoints save the global Python and NumPy RNG states, which training never seeds (it draws
#    from its own seeded generators), so they hold whatever the process started with.
TIMING_KEY = re.compile(r"seconds|per_s$|^system\b")
RUN_STAMPS = [
    (re.compile(r"\d{8}T\d{6}\.\d+Z"), "<run-id>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?: UTC|Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(r"(_run_time_sort\W+)[\d.]+"), r"\1<time>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\.validate-[\w-]+"), ".validate-<tmp>"),
]


def _without_timings(obj: Any, key: re.Pattern = TIMING_KEY) -> Any:
    if isinstance(obj, dict):
        return {k: _without_timings(v, key) for k, v in obj.items() if not (isinstance(k, str) and key.search(k))}
    if isinstance(obj, list):
        return [_without_timings(v, key) for v in obj]
    return obj


def _without_run_stamps(text: str) -> str:
    for pattern, replacement in RUN_STAMPS:
        text = pattern.sub(replacement, text)
    return text


def _onnx_without_stack_traces(path: Path) -> bytes:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    return model.SerializeToString(deterministic=True)


def _torchscript_without_debug_info(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()
                if not name.endswith((".debug_pkl", "serialization_id"))}


def _same(a: Any, b: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b


def _checkpoint_without_run_state(path: Path) -> Any:
    import torch

    state = _without_timings(torch.load(path, map_location="cpu", weights_only=False))
    state.pop("save_id", None)  # random by design: which save this is, so ranks can tell two saves apart
    rng = state.get("rng")
    for generators in rng if isinstance(rng, list) else [rng]:
        if isinstance(generators, dict):
            generators.pop("python", None)
            generators.pop("numpy", None)
    return state


def _digits_masked(text: str) -> str:
    return re.sub(r"\d+", "#", text)


def why_different(rel: str, a: Path, b: Path, root_a: Path, root_b: Path) -> str | None:
    """The known cause of two runs writing different bytes to one file; None when there is none."""
    if rel.endswith(".json"):
        if _without_timings(json.loads(a.read_text())) == _without_timings(json.loads(b.read_text())):
            return "timings"
        if rel.endswith("export.json"):
            also_sizes = re.compile(f"{TIMING_KEY.pattern}|^size_mb$")
            if _without_timings(json.loads(a.read_text()), also_sizes) == _without_timings(json.loads(b.read_text()),
                                                                                           also_sizes):
                return "timings, and ONNX file sizes (the graphs hold absolute source paths)"
        if a.read_text().replace(str(root_a), "<project>") == b.read_text().replace(str(root_b), "<project>"):
            return "absolute project path"
    if rel.endswith(".tsv") and (TIMING_KEY.search(Path(rel).stem) or "/system/" in rel):
        return "throughput and resource-use series"
    if rel.startswith("models/checkpoints/") and rel.endswith(".pt"):
        if _same(_checkpoint_without_run_state(a), _checkpoint_without_run_state(b)):
            return "run measurements, the save's random id and unseeded global RNG states in the resume checkpoint"
    if rel.endswith(".onnx") and _onnx_without_stack_traces(a) == _onnx_without_stack_traces(b):
        return "source paths in ONNX stack-trace metadata"
    if rel.endswith(".ts.pt") and _torchscript_without_debug_info(a) == _torchscript_without_debug_info(b):
        return "source paths in TorchScript debug info"
    if rel == "models/release/README.md":
        # The card is rendered from metrics/*.json, whose differences the json rule above limits to timings: only
        # digits may differ (training time, tokens/s).
        if _digits_masked(a.read_text()) == _digits_masked(b.read_text()):
            return "training time and speed in the model card"
    if rel.startswith("reports/validation/") and rel.endswith(".html"):
        if _without_run_stamps(a.read_text()) == _without_run_stamps(b.read_text()):
            return "validation run time stamps"
    return None


def _files(root: Path, out: str) -> dict[str, Path]:
    path = root / out
    found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {_without_run_stamps(p.relative_to(root).as_posix()): p for p in found}


def compare_runs(root_a: Path, root_b: Path) -> tuple[dict[str, str], list[str]]:
    """dvc.lock of two runs: (output -> cause, for outputs that differ for a known cause), unexplained differences."""
    lock_a = yaml.safe_load((root_a / "dvc.lock").read_text())["stages"]
    lock_b = yaml.safe_load((root_b / "dvc.lock").read_text())["stages"]
    explained: dict[str, str] = {}
    unexplained: list[str] = []
    if set(lock_a) != set(lock_b):
        return explained, [f"stages differ: {sorted(lock_a)} vs {sorted(lock_b)}"]
    outputs = {o["path"] for s in lock_a.values() for o in s.get("outs", [])}
    for stage, a in lock_a.items():
        b = lock_b[stage]
        if a.get("cmd") != b.get("cmd") or a.get("params") != b.get("params"):
            unexplained.append(f"{stage}: cmd or params differ")
        deps_b = {d["path"]: d.get("md5") for d in b.get("deps", [])}
        for dep in a.get("deps", []):
            if dep.get("md5") != deps_b.get(dep["path"]) and dep["path"] not in outputs:
                unexplained.append(f"{stage}: dependency {dep['path']} differs")  # code or data, not an output
        outs_b = {o["path"]: o.get("md5") for o in b.get("outs", [])}
        for out in a.get("outs", []):
            if out.get("md5") == outs_b.get(out["path"]):
                continue
            files_a, files_b = _files(root_a, out["path"]), _files(root_b, out["path"])
            if set(files_a) != set(files_b):
                unexplained.append(f"{out['path']}: files differ: {sorted(set(files_a) ^ set(files_b))}")
                continue
            causes = set()
            for rel, file_a in files_a.items():
                if file_a.read_bytes() != files_b[rel].read_bytes():
                    cause = why_different(rel, file_a, files_b[rel], root_a, root_b)
                    causes.add(cause or "")
                    if cause is None:
                        unexplained.append(f"{out['path']}: {rel} differs for no known reason")
            explained[out["path"]] = ", ".join(sorted(c for c in causes if c))
    return explained, unexplained


def test_prefect_and_dvc_repro_from_the_same_params_give_the_same_dvc_lock(first_nightly, project, reference_repro):
    """The Prefect nightly and a plain `dvc repro` in a fresh clone of the same commit record the same hashes for
    every dependency, param and learned artifact; the few outputs that differ differ only for the causes above."""
    clone = reference_repro()
    explained, unexplained = compare_runs(project, clone)
    assert unexplained == []
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    reference = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]
    for stage, out in (("clean", "data/clean"), ("tokenize", "data/tokenized"), ("train", "models/final"),
                       ("evaluate", "reports/eval")):
        md5 = {o["path"]: o["md5"] for o in lock[stage]["outs"]}[out]
        assert md5 == {o["path"]: o["md5"] for o in reference[stage]["outs"]}[out], out  # bit-identical
    # Exactly the outputs with a known cause differ, and for that cause only.
    assert set(explained) <= {"data/raw", "reports/validation", "models/export", "models/checkpoints",
                              "metrics/train.json", "dvclive/metrics.json", "dvclive/plots/metrics",
                              "metrics/eval.json", "metrics/export.json", "metrics/tokenize.json",
                              "metrics/clean.json", "metrics/validation.json", "models/release"}, explained


# ---------------------------------------------------------------------------------------------------------------
# prefect.yaml also deploys to a work pool (last: it moves the deployments from the runner to the pool)


def test_prefect_yaml_deploys_both_deployments_to_the_gpu_work_pool(first_nightly, prefect_server, project):
    from prefect.client.orchestration import get_client

    for args in (["work-pool", "create", "gpu-pool", "--type", "process"], ["--no-prompt", "deploy", "--all"]):
        result = subprocess.run([str(BIN / "prefect"), *args], cwd=project, env=prefect_server,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name(NIGHTLY)
        experiment = client.read_deployment_by_name(EXPERIMENT)
    assert nightly.work_pool_name == experiment.work_pool_name == "gpu-pool"
    assert nightly.entrypoint == "pipeline.tools.flow.pipeline" and nightly.parameters == {"push": True}
    assert [(s.schedule.cron, s.schedule.timezone) for s in nightly.schedules] == [("0 2 * * *", "UTC")]
    assert experiment.schedules == []
