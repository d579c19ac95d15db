"""The README's Layout section is a true map of the tree: every module of pipeline/, stages/ and bench/ has its
line there, and every path it names exists, so the map neither omits nor invents.

The section's code block is a tree, one entry a line: the entry's name (a directory ends with `/`), indented two
spaces under its directory, then at least two spaces and what it holds. A `__main__.py`, and an `__init__.py` that
holds only a docstring, need no line; an `__init__.py` with code (a stage's `run`) is its package's line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAPPED_TREES = ("pipeline", "stages", "bench")
ENTRY = re.compile(r"(?P<indent> *)(?P<name>\S+)(?: {2,}\S.*)?")


def layout_block(text: str) -> list[str]:
    """The lines of the first code block under `## Layout`, up to the next `## ` heading."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "README.md's Layout section has no code block"
    return block.group(1).splitlines()


def mapped_paths(lines: list[str]) -> dict[str, int]:
    """Each entry's path relative to the repository (directories with a trailing `/`), with its line in the block."""
    paths: dict[str, int] = {}
    directories: list[str] = []  # the directory of each indentation depth above the current line
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        entry = ENTRY.fullmatch(line)
        assert entry, f"Layout line {number} is not `name  description`: {line!r}"
        depth, remainder = divmod(len(entry["indent"]), 2)
        assert not remainder and depth <= len(directories), f"Layout line {number} is indented off the tree: {line!r}"
        del directories[depth:]
        path = "".join(directories) + entry["name"]
        paths[path] = number
        if path.endswith("/"):
            directories.append(entry["name"])
    return paths


def holds_code(init: Path) -> bool:
    """Whether an `__init__.py` holds more than a docstring."""
    body = ast.parse(init.read_text(encoding="utf-8")).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def modules_to_map() -> set[str]:
    """The paths the map must name: every module, a package whose `__init__.py` holds code as its directory."""
    wanted: set[str] = set()
    for tree in MAPPED_TREES:
        for module in (REPO / tree).rglob("*.py"):
            relative = module.relative_to(REPO)
            if "__pycache__" in relative.parts or module.name == "__main__.py":
                continue
            if module.name == "__init__.py":
                if holds_code(module):
                    wanted.add(f"{relative.parent.as_posix()}/")
                continue
            wanted.add(relative.as_posix())
    return wanted


def test_every_module_of_pipeline_stages_and_bench_has_its_line_in_the_layout():
    mapped = mapped_paths(layout_block(README.read_text(encoding="utf-8")))
    missing = sorted(modules_to_map() - set(mapped))
    assert not missing, f"README.md's Layout section lacks a line for: {', '.join(missing)}"


def test_every_path_the_layout_names_exists():
    mapped = mapped_paths(layout_block(README.read_text(encoding="utf-8")))
    invented = [f"{path} (line {number})" for path, number in mapped.items() if not (REPO / path).exists()]
    assert not invented, f"README.md's Layout section names paths that do not exist: {', '.join(invented)}"


def test_a_directory_entry_in_the_layout_is_a_directory():
    mapped = mapped_paths(layout_block(README.read_text(encoding="utf-8")))
    wrong = [path for path in mapped if (REPO / path).exists() and path.endswith("/") != (REPO / path).is_dir()]
    assert not wrong, f"README.md's Layout section marks these as directories or files wrongly: {', '.join(wrong)}"
