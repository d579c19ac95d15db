"""pipeline/tools/flow.py without a server: DAG order from DVC, task options, DVC output, reports, prefect.yaml."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.tools import cli
from pipeline.tools import flow as mtflow

REPO = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).with_name("dvc"))


def dvc_project(root: Path, dvc_yaml: str | None = None) -> Path:
    """A DVC project (no git) holding the real dvc.yaml and params.yaml, or the given dvc.yaml text."""
    if dvc_yaml is None:
        shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    else:
        (root / "dvc.yaml").write_text(dvc_yaml)
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    subprocess.run([DVC, "init", "--no-scm", "-q"], cwd=root, check=True)
    return root


def test_stage_order_puts_each_stage_after_its_upstream_and_keeps_declaration_order_for_ties():
    upstream = {"a": [], "b": ["a"], "d": ["b"], "c": ["b"], "e": ["c", "d"]}
    assert mtflow.stage_order(upstream) == ["a", "b", "d", "c", "e"]
    # Declared in reverse, the same graph still runs parents first.
    assert mtflow.stage_order(dict(reversed(upstream.items()))) == ["a", "b", "c", "d", "e"]


def test_stage_order_rejects_cycles_and_unknown_stages():
    with pytest.raises(ValueError, match="cycle"):
        mtflow.stage_order({"a": ["b"], "b": ["a"]})
    with pytest.raises(ValueError, match="unknown"):
        mtflow.stage_order({"a": ["missing"]})


def test_the_order_of_the_real_dvc_yaml_comes_from_dvc(tmp_path):
    graph = mtflow.read_stage_graph(dvc_project(tmp_path))
    assert graph["check_params"] == []
    assert graph["download"] == ["check_params"]
    assert graph["tokenize"] == ["clean", "validate"]
    assert graph["export"] == ["clean", "train"]
    assert mtflow.stage_order(graph) == list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])


def test_changing_dvc_yaml_changes_the_order_the_flow_runs(tmp_path):
    # `report` is declared first but reads what `make` writes: only DVC's graph can tell it runs second.
    dvc_yaml = """
stages:
  report:
    cmd: cp made.txt report.txt
    deps: [made.txt]
    outs: [report.txt]
  make:
    cmd: echo x > made.txt
    outs: [made.txt]
"""
    graph = mtflow.read_stage_graph(dvc_project(tmp_path, dvc_yaml))
    assert graph == {"report": ["make"], "make": []}
    assert mtflow.stage_order(graph) == ["make", "report"]


def test_only_the_download_stage_retries_with_exponential_backoff():
    download = mtflow.stage_task("download")
    assert download.retries == mtflow.DOWNLOAD_RETRIES == 3
    assert download.retry_delay_seconds == [30.0, 60.0, 120.0]
    for stage in ("clean", "validate", "tokenize", "train", "evaluate", "export"):
        assert mtflow.stage_task(stage).retries == 0, stage


def test_no_prefect_result_caching_on_dvc_tasks_or_flows():
    from prefect.cache_policies import NO_CACHE

    for task in (mtflow.stage_task("download"), mtflow.stage_task("train"), mtflow.push_to_remote,
                 mtflow.run_experiment):
        assert task.cache_policy is NO_CACHE, task.name
        assert task.persist_result is False, task.name
    for flow in (mtflow.pipeline, mtflow.experiment):
        assert flow.persist_result is False, flow.name


def test_stage_outcome_reads_what_dvc_printed():
    assert mtflow.stage_outcome("train", ["Running stage 'train':", "> python -m stages.train"]) == "ran"
    assert mtflow.stage_outcome("train", ["Stage 'train' didn't change, skipping"]) == "skipped"
    assert mtflow.stage_outcome("train", ["Stage 'train' is cached - skipping run, checking out outputs"]) == "restored"
    assert mtflow.stage_outcome("train", ["Running stage 'evaluate':"]) == "unknown"


def test_command_output_reaches_the_log_line_by_line_while_the_command_runs(tmp_path):
    script = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')\n"
    seen: list[tuple[str, float]] = []
    start = time.monotonic()
    result = mtflow.run_streamed([sys.executable, "-c", script], tmp_path,
                                 lambda line: seen.append((line, time.monotonic() - start)))
    assert result.returncode == 0
    assert [line for line, _ in seen] == ["first", "second"]
    assert seen[1][1] - seen[0][1] > 1.0  # the first line was logged before the command finished


def test_a_failed_command_keeps_its_error_lines():
    script = ("import sys\nprint('working')\nprint('ERROR train failed: 1 invalid parameter(s):', file=sys.stderr)\n"
              "print('  train.lr = -1: Input should be greater than 0', file=sys.stderr)\nsys.exit(1)\n")
    result = mtflow.run_streamed([sys.executable, "-c", script], ".", lambda line: None)
    assert result.returncode == 1
    assert result.error_lines() == ["ERROR train failed: 1 invalid parameter(s):",
                                    "  train.lr = -1: Input should be greater than 0"]
    message = str(mtflow.StageFailed("train", 1, result.error_lines()))
    assert "stage 'train' failed" in message and "train.lr = -1" in message
    long_output = mtflow.CommandOutput(1, ["ok", "ERROR first", *[f"line {i}" for i in range(50)]])
    assert long_output.error_lines()[0] == "ERROR first" and long_output.error_lines()[-1] == "line 49"


def test_without_a_dvc_remote_push_is_skipped_and_with_one_it_is_found(tmp_path):
    root = dvc_project(tmp_path)
    assert mtflow.default_remote(root) is None
    subprocess.run([DVC, "remote", "add", "-d", "storage", str(tmp_path / "remote")], cwd=root, check=True,
                   capture_output=True)
    assert mtflow.default_remote(root) == "storage"


def test_overrides_become_dvc_set_param_arguments():
    args = mtflow.exp_run_args({"train.lr": 0.001, "model.preset": "cpu-ref", "export.onnx": False,
                                "data.max_train_pairs": None, "evaluate.beam": 2}, "lower-lr")
    assert args == ["exp", "run", "--temp", "-S", "++train.lr=0.001", "-S", "++model.preset=cpu-ref",
                    "-S", "++export.onnx=false", "-S", "++data.max_train_pairs=null", "-S", "++evaluate.beam=2",
                    "-n", "lower-lr"]
    # A string that YAML would read as another type stays a string.
    assert mtflow.format_override("data.subsample", "no") == "data.subsample='no'"
    with pytest.raises(ValueError, match="section.name"):
        mtflow.format_override("lr", 0.1)


def test_cli_reads_set_param_values_as_yaml():
    assert cli.parse_overrides(["train.lr=0.001", "model.preset=tiny", "export.onnx=false"]) == {
        "train.lr": 0.001, "model.preset": "tiny", "export.onnx": False}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cli.parse_overrides(["train.lr"])


def test_cli_flow_run_runs_the_pipeline_flow_once(monkeypatch, tmp_path):
    calls = []

    def fake_pipeline(**kwargs):
        calls.append(kwargs)
        from prefect.states import Completed

        return Completed()

    monkeypatch.setattr(mtflow, "pipeline", fake_pipeline)
    assert cli.main(["flow", "run", "--project", str(tmp_path), "--push"]) == 0
    assert calls == [{"project_dir": str(tmp_path), "push": True, "return_state": True}]


def test_experiment_name_is_read_from_dvc_output():
    lines = ["Reproducing experiment 'hasty-ords'", "", "Ran experiment(s): hasty-ords", "To apply ..."]
    assert mtflow.experiment_name(lines) == "hasty-ords"
    assert mtflow.experiment_name(["nothing"]) is None


EXP_SHOW = [
    {"rev": "workspace", "name": None, "data": {}, "error": None, "experiments": None},
    {"rev": "abc123", "name": "main", "data": {}, "error": None, "experiments": [
        {"revs": [{"rev": "def456", "name": "beam-2", "data": {"metrics": {
            "metrics/eval.json": {"data": {
                "test": {"en-de": {"bleu": 12.345, "chrf": 40.1, "ter": 70.0, "sentences": 268}},
                "newstest2014": {"en-de": {"bleu": 9.0, "chrf": 35.25, "ter": 80.0, "sentences": 3003},
                                 "en-fr": {"bleu": 11.0, "chrf": 38.0, "ter": 75.0, "sentences": 3003}},
                "macro": {"bleu": 10.78, "chrf": 37.78, "ter": 75.0}}},
            "metrics/train.json": {"data": {"tgt_tokens_per_s": 22138.8, "train_seconds": 47.9}},
        }}}]},
    ]},
]


def test_experiment_report_has_name_scores_per_test_set_speed_and_wall_time():
    metrics = mtflow.experiment_metrics(EXP_SHOW, "beam-2")
    report = mtflow.experiment_report("beam-2", {"evaluate.beam": 2}, metrics, wall_seconds=61.23)
    assert report.scores == {"test en-de": {"bleu": 12.345, "chrf": 40.1},
                             "newstest2014 en-de": {"bleu": 9.0, "chrf": 35.25},
                             "newstest2014 en-fr": {"bleu": 11.0, "chrf": 38.0}}
    markdown = report.markdown()
    assert "# Experiment `beam-2`" in markdown
    assert "`evaluate.beam=2`" in markdown
    assert "| test en-de | 12.35 | 40.10 |" in markdown
    assert "| newstest2014 en-fr | 11.00 | 38.00 |" in markdown
    assert "22,138.8 target tokens/s (training time 47.9 s)" in markdown
    assert "61.2 s" in markdown
    with pytest.raises(KeyError):
        mtflow.experiment_metrics(EXP_SHOW, "missing")
    assert mtflow.artifact_key("Beam_2 run") == "experiment-beam-2-run"


def test_prefect_yaml_declares_a_nightly_cron_and_an_unscheduled_experiment():
    specs = {spec.name: spec for spec in mtflow.load_deployment_specs(REPO / "prefect.yaml")}
    assert set(specs) == {"nightly", "experiment"}
    assert specs["nightly"].crons == (("0 2 * * *", "UTC"),)
    assert specs["nightly"].parameters == {"push": True}
    assert specs["experiment"].crons == ()
    for spec in specs.values():
        flow = mtflow.load_flow(spec.entrypoint)
        accepted = set(inspect.signature(flow.fn).parameters)
        assert set(spec.parameters) <= accepted, spec.name
        assert "project_dir" in accepted
    assert mtflow.load_flow(specs["nightly"].entrypoint) is mtflow.pipeline
    assert mtflow.load_flow(specs["experiment"].entrypoint) is mtflow.experiment


def test_prefect_yaml_work_pools_request_gpus():
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    pools = config["definitions"]["work_pools"]
    assert pools["gpu_process"]["name"] == "gpu-pool"  # the pool docker/compose.yaml's prefect-worker polls
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    assert "--pool gpu-pool" in " ".join(compose["services"]["prefect-worker"]["command"])
    requests = pools["gpu_docker"]["job_variables"]["container_create_kwargs"]["device_requests"]
    assert requests == [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    assert pools["gpu_kubernetes"]["job_variables"]["gpus"] >= 1
