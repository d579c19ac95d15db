"""Every project module a stage runs is one of that stage's `deps` in dvc.yaml, so a code change reruns the stage.

The stage's module (`python -m stages.<name>`) is walked through its imports, transitively and inside this
repository only, lazy imports in function bodies included (they run too). A module is covered when its file, or a
directory above it, is listed in the stage's deps.
"""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
PROJECT_PACKAGES = ("pipeline", "stages")

# Shared plumbing deliberately left out of every stage's deps: listing it would rerun the whole DAG whenever it
# changes, although none of it changes what a stage computes.
#   params.py:    param values are tracked through each stage's `params:`; the schema itself (a new key, a new
#                 check) is the check_params stage's dep, which fails the DAG on a params file it rejects.
#   artifacts.py: where artifacts live; dvc.yaml names the same paths, and test_dag.py keeps the two in sync.
#   errors.py, runtime/errors.py: exception classes and their messages.
#   stage.py:     the shared `__main__` (load params, run, log one summary line).
#   __init__.py of the package markers: a docstring and nothing else (a test below keeps them so).
MARKERS = ("pipeline/__init__.py", "stages/__init__.py", "pipeline/runtime/__init__.py")
PLUMBING = {"pipeline/params.py", "pipeline/artifacts.py", "pipeline/errors.py", "pipeline/runtime/errors.py",
            "pipeline/stage.py", *MARKERS}


def module_file(name: str) -> Path | None:
    """The file of a dotted module name inside the repository, or None when it is not a project module."""
    if name.split(".")[0] not in PROJECT_PACKAGES:
        return None
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def package_of(path: Path) -> list[str]:
    """The package a repository file belongs to, as name parts (what its relative imports are relative to)."""
    return list(path.relative_to(REPO).parent.parts)


def imported_modules(path: Path, package: list[str]) -> set[str]:
    """Dotted names of every module `path` imports anywhere in its body (relative imports resolved in `package`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            # `from pkg import mod` imports a module when `mod` is one.
            names.update(f"{base}.{alias.name}" for alias in node.names)
    # Importing a.b.c runs a/__init__.py and a/b/__init__.py too.
    return {".".join(n.split(".")[:i]) for n in names if n for i in range(1, n.count(".") + 2)}


def files_a_stage_runs(stage: str) -> set[str]:
    """Repository-relative paths of the project files the stage's command imports, transitively."""
    entry = DVC[stage]["cmd"].removeprefix("python -m ").split()[0]  # a student stage's module, without --student
    todo = [entry, f"{entry}.__main__"]
    seen: set[Path] = set()
    while todo:
        path = module_file(todo.pop())
        if path is None or path in seen:
            continue
        seen.add(path)
        todo.extend(imported_modules(path, package_of(path)))
    return {p.relative_to(REPO).as_posix() for p in seen}


def covered(file: str, deps: list[str]) -> bool:
    return any(file == dep or file.startswith(dep.rstrip("/") + "/") for dep in deps)


def test_the_import_walk_finds_lazy_and_relative_imports(tmp_path):
    # The walk itself must see what a stage really runs, or the completeness test below proves nothing.
    assert "pipeline/corpus.py" in files_a_stage_runs("evaluate") or "pipeline/corpus.py" in files_a_stage_runs(
        "export"
    )
    assert "stages/train/loop.py" in files_a_stage_runs("train")  # reached from torchrun's module, lazily
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from pipeline.runtime import decoding\n    import stages.clean\n"
                      "    from . import bleu\n")
    found = imported_modules(sample, ["stages", "train"])
    assert {"pipeline.runtime.decoding", "stages.clean", "pipeline", "stages", "stages.train.bleu"} <= found


def test_the_package_markers_left_out_of_the_deps_hold_no_code():
    for marker in MARKERS:
        body = ast.parse((REPO / marker).read_text()).body
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body), marker


def test_every_project_module_a_stage_imports_is_one_of_its_deps():
    missing = {}
    for stage, spec in DVC.items():
        uncovered = sorted(f for f in files_a_stage_runs(stage) - PLUMBING if not covered(f, spec["deps"]))
        if uncovered:
            missing[stage] = uncovered
    assert not missing, f"dvc.yaml deps lack the modules these stages import: {missing}"


def test_no_stage_lists_the_plumbing_as_a_dep():
    for stage, spec in DVC.items():
        if stage != "check_params":
            assert not PLUMBING & set(spec["deps"]), stage
