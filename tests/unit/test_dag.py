"""dvc.yaml and pipeline/artifacts.py name the same paths, and the DAG chains the stages in order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.artifacts import Paths
from pipeline.params import parse

REPO = Path(__file__).resolve().parents[2]
TEACHER = ["check_params", "download", "clean", "validate", "tokenize", "train", "evaluate", "export", "card"]
# The distilled student's stages: the teacher's modules from clean on, run with --student (pipeline/stage.py).
STUDENT = ["student_clean", "student_validate", "student_tokenize", "student_train", "student_evaluate",
           "student_export", "student_card"]
ORDER = [*TEACHER, "distill", *STUDENT]
# With the one template dvc.yaml has resolved as DVC resolves it for the default params: the distillation's
# teacher, this run's own export.
TEMPLATE = "${distill.teacher}"
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text().replace(TEMPLATE, parse({}).distill.teacher))["stages"]


def module_of(stage: str) -> str:
    return stage.removeprefix("student_")


def names(entries):
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries]


def test_the_dag_has_the_stages_in_order_each_fed_by_the_previous():
    # evaluate and export both read the trained model; neither needs the other's output.
    assert list(DVC) == ORDER
    produced: dict[str, str] = {}
    for stage, spec in DVC.items():
        for out in names(spec.get("outs", [])) + names(spec.get("metrics", [])):
            produced[out] = stage
    after_of = {"export": "train", "student_export": "student_train", "distill": "export"}
    for chain in (TEACHER, ["distill", *STUDENT]):
        for before, after in zip(chain, chain[1:], strict=False):
            upstream = {produced.get(d) for d in DVC[after]["deps"]}
            assert after_of.get(after, before) in upstream, (after, upstream)
    # The distillation reads the teacher's export and cleaned training pairs; the student is scored beside the
    # teacher's evaluation.
    assert {"models/export", "data/clean", "data/raw"} <= set(DVC["distill"]["deps"])
    assert (REPO / "dvc.yaml").read_text().count(TEMPLATE) == 1  # the teacher is a dependency, whichever it is
    assert "metrics/eval.json" in DVC["student_evaluate"]["deps"]


def test_each_stage_runs_its_own_module_and_depends_on_its_code():
    for stage, spec in DVC.items():
        module_name = module_of(stage)
        student = " --student" if stage.startswith("student_") else ""
        assert spec["cmd"] == f"python -m stages.{module_name}{student}"
        # A stage is a module or, when it is big, a package of one-idea modules.
        module = f"stages/{module_name}" if (REPO / "stages" / module_name).is_dir() else f"stages/{module_name}.py"
        assert module in spec["deps"], stage
        assert (REPO / module).exists()


def test_outputs_are_the_paths_the_stages_write():
    teacher, student = Paths(Path(".")), Paths(Path("."), "student")
    assert {Path(o) for o in names(DVC["check_params"]["outs"])} == {teacher.params_checked}
    for stage in ORDER[1:]:
        paths = student if stage == "distill" or stage in STUDENT else teacher
        spec = DVC[stage]
        declared = {Path(o) for o in names(spec["outs"]) + names(spec.get("metrics", []))}
        # The teacher's curves are also its plots (dvc.yaml); DVCLive writes them beside its metrics.json.
        declared |= {paths.dvclive / "metrics.json"} if module_of(stage) == "train" else set()
        assert declared == set(paths.outputs(module_of(stage))), stage


def test_student_stages_read_the_distill_params_and_teacher_stages_never_do():
    for stage in TEACHER:
        assert not any(p.startswith("distill") for p in DVC[stage].get("params", [])), stage
    for stage in ["distill", *STUDENT]:
        # distill.enabled: switching distillation on or off reruns each (off, it writes a note into its outputs).
        assert "distill.enabled" in DVC[stage]["params"], stage
    assert DVC["student_train"]["params"] == ["distill.enabled", "distill.model", "distill.train"]
    # The student's export block is its own, so the teacher's export never reruns for a student's shortlist.
    assert "distill.export" in DVC["student_export"]["params"] and "export" not in DVC["student_export"]["params"]


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
        "stages.tokenize, stages.distill, "
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


def test_mtpipe_stage_knows_every_stage_and_runs_the_command_dvc_runs():
    from pipeline.tools.cli import STAGES, STUDENT_STAGES, stage_command

    assert sorted(STAGES + STUDENT_STAGES) == sorted(DVC)
    for stage, spec in DVC.items():
        assert stage_command(stage)[1:] == spec["cmd"].split()[1:], stage
