"""The layers of the code, by who may import whom: `pipeline/runtime/` (torch-free: `mtpipe translate`, `mtpipe
serve`) imports nothing else of the project; the plumbing (the rest of `pipeline/`) and the stages never import the
tools (`pipeline/tools/`: the CLI, the Prefect flow, the plots page); nothing shipped imports the tests.

Every import in a module's body counts, lazy ones in functions included: they run too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_dag_deps import REPO, imported_modules, package_of

RUNTIME, TOOLS = "pipeline.runtime", "pipeline.tools"
# Third-party packages the runtime may not import: what it exists to run without.
HEAVY = ("torch", "transformers", "great_expectations", "prefect", "dvc", "pandas", "pyarrow", "sacrebleu")


def modules_under(folder: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module under a repository folder."""
    files = sorted((REPO / folder).rglob("*.py"))
    return {".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): f for f in files}


def project_imports(path: Path) -> set[str]:
    return {name for name in imported_modules(path, package_of(path)) if name.split(".")[0] in ("pipeline", "stages",
                                                                                                   "tests", "bench")}


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_runtime_imports_nothing_of_the_project_outside_itself():
    outside = {module: sorted(name for name in project_imports(path)
                              if not within(name, RUNTIME) and name != "pipeline")
               for module, path in modules_under("pipeline/runtime").items()}
    assert not {module: names for module, names in outside.items() if names}


def test_the_runtime_imports_none_of_the_heavy_libraries_anywhere_in_its_code():
    heavy = {module: sorted(name for name in imported_modules(path, package_of(path))
                            if name.split(".")[0] in HEAVY)
             for module, path in modules_under("pipeline/runtime").items()}
    assert not {module: names for module, names in heavy.items() if names}


@pytest.mark.parametrize("folder", ["pipeline", "stages"])
def test_the_plumbing_and_the_stages_never_import_the_tools(folder):
    users = {module: sorted(name for name in project_imports(path) if within(name, TOOLS))
             for module, path in modules_under(folder).items() if not within(module, TOOLS)}
    assert not {module: names for module, names in users.items() if names}


@pytest.mark.parametrize("folder", ["pipeline", "stages"])
def test_nothing_shipped_imports_the_tests_or_the_benches(folder):
    users = {module: sorted(name for name in project_imports(path) if name.split(".")[0] in ("tests", "bench"))
             for module, path in modules_under(folder).items()}
    assert not {module: names for module, names in users.items() if names}


def test_every_runtime_module_imports_with_torch_and_transformers_unimportable():
    """A None entry in sys.modules makes `import torch` raise ImportError, as on a machine without it."""
    modules = sorted(modules_under("pipeline/runtime"))
    code = ("import sys\n"
            f"for name in {HEAVY!r}:\n"
            "    sys.modules[name] = None\n"
            "import importlib\n"
            f"for module in {modules!r}:\n"
            "    importlib.import_module(module)\n"
            "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
