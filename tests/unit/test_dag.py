"""dvc.yaml and pipeline/artifacts.py name the same paths, and the DAG chains the stages in order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.artifacts import Paths
from pipeline.params import parse

REPO = Path(__file__).resolve().parents[2]
ORDER = ["check_params", "download", "clean", "validate", "tokenize", "train", "evaluate", "export", "card"]
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def names(entries):
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries]


def test_the_dag_has_the_stages_in_order_each_fed_by_the_previous():
    # evaluate and export both read the trained model; neither needs the other's output.
    assert list(DVC) == ORDER
    produced: dict[str, str] = {}
    for stage, spec in DVC.items():
        for out in names(spec.get("outs", [])) + names(spec.get("metrics", [])):
            produced[out] = stage
    for before, after in zip(ORDER, ORDER[1:], strict=False):
        upstream = {produced.get(d) for d in DVC[after]["deps"]}
        assert (before if after != "export" else "train") in upstream, (after, upstream)


def test_each_stage_runs_its_own_module_and_depends_on_its_code():
    for stage, spec in DVC.items():
        assert spec["cmd"] == f"python -m stages.{stage}"
        # A stage is a module or, when it is big, a package of one-idea modules.
        module = f"stages/{stage}" if (REPO / "stages" / stage).is_dir() else f"stages/{stage}.py"
        assert module in spec["deps"], stage
        assert (REPO / module).exists()


def test_outputs_are_the_paths_the_stages_write():
    paths = Paths(Path("."))
    expected = {
        "check_params": {paths.params_checked},
        "download": {paths.raw},
        "clean": {paths.clean},
        "validate": {paths.validation_report},
        "tokenize": {paths.tokenized},
        "train": {paths.final_model, paths.checkpoints},
        "evaluate": {paths.eval_dir},
        "export": {paths.export},
        "card": {paths.release},
    }
    for stage, outs in expected.items():
        assert {Path(o) for o in names(DVC[stage]["outs"])} == outs, stage
    metric_files = {"clean": "clean", "validate": "validation", "tokenize": "tokenize", "train": "train",
                    "evaluate": "eval", "export": "export"}
    for stage, name in metric_files.items():
        assert str(paths.metrics(name)) in names(DVC[stage]["metrics"]), stage


def test_every_param_a_stage_declares_exists_in_the_schema():
    params = parse({}).model_dump(by_alias=True)
    for stage, spec in DVC.items():
        for key in spec.get("params", []):
            node = params
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"{stage}: {key}"
                node = node[part]


def test_train_reruns_only_for_model_and_train_params():
    assert DVC["train"]["params"] == ["model", "train"]
    for stage in ("evaluate", "export"):
        assert not any(p.startswith(("train", "model")) for p in DVC[stage]["params"])


def test_stage_modules_import_without_heavy_libraries():
    code = (
        "import sys\n"
        "import pipeline.tools.cli, stages.check_params, stages.download, stages.clean, stages.validate, "
        "stages.tokenize, "
        "stages.train, stages.evaluate, stages.export, stages.card\n"
        "heavy = [m for m in ('torch', 'transformers', 'great_expectations', 'prefect', 'dvc', 'onnxruntime',"
        " 'datasets', 'pandas') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_dependency_is_a_file_in_the_repo_or_an_output_of_an_earlier_stage():
    produced: set[str] = set()
    for stage, spec in DVC.items():
        for dep in spec["deps"]:
            assert dep in produced or (REPO / dep).exists(), f"{stage}: {dep}"
        produced.update(names(spec.get("outs", [])) + names(spec.get("metrics", [])))
