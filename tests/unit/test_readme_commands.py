"""Every command the README's bash blocks show exists in the project's environment: for each command line whose
program the project installs (mtpipe, dvc, hf, prefect, python -m ..., make), that command's `--help` exits 0 and
lists every option the README passes it (for make: the target exists, `make -n TARGET`). Shell builtins are
skipped, and so are the tools the README names from outside the environment (docker, curl, git, ...), which must
be listed below: a program that is neither fails the test until it is placed.

Each console script's --help calls run in one process of their own (prefect and dvc are imported once), those
processes in parallel; the whole file takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

BUILTINS = {"cd", "source", ".", "cp", "export", "echo", "mkdir", "cat", "ls", "rm", "mv", "test", "true"}
# Tools the README shows that the project's environment does not provide (nor check here).
EXTERNAL = {"docker", "curl", "git", "jq", "pip", "openssl", "apt-get", "npm"}
# The project's console scripts (installed with it), and the other programs of its environment.
CONSOLE_SCRIPTS = ("mtpipe", "dvc", "hf", "prefect")
PROJECT = {*CONSOLE_SCRIPTS, "python", "python3", "make"}
SEPARATORS = {"&&", "||", "|", ";", "&"}
REDIRECTIONS = {"<", ">", ">>", "2>", "&>"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def bash_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, body) of every ```bash block."""
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```bash\n(.*?)```", text, re.S)]


def logical_lines(body: str) -> list[str]:
    """The block's lines, a backslash-continued line or an open quote joined with the next."""
    lines, pending, joiner = [], "", ""
    for line in body.splitlines():
        pending = f"{pending}{joiner}{line}" if pending else line
        if pending.endswith("\\"):  # bash drops a backslash-newline
            pending, joiner = pending[:-1], ""
            continue
        joiner = "\n"
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        lines.append(pending)
        pending = ""
    assert not pending, f"an unterminated command in a bash block: {pending!r}"
    return lines


def commands_of(line: str) -> list[list[str]]:
    """The simple commands of one shell line: split at && || | ; &, redirections and leading VAR=value
    assignments dropped; command substitutions stand for a word."""
    lexer = shlex.shlex(re.sub(r"\$\([^()]*\)", "SUBSTITUTED", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    commands: list[list[str]] = [[]]
    tokens = iter(lexer)
    for token in tokens:
        if token in SEPARATORS:
            commands.append([])
        elif token in REDIRECTIONS:
            next(tokens, None)
        elif commands[-1] or not ASSIGNMENT.match(token):
            commands[-1].append(token)
    return [c for c in commands if c]


@dataclass(frozen=True)
class Check:
    """One call that checks README commands: the program and its arguments (a console script's subcommand path and
    --help, `make -n TARGET`, `python -m MODULE --help`), the options the help must list, the blocks they are in."""

    program: str
    args: tuple[str, ...]
    options: tuple[str, ...]
    where: str

    def __str__(self) -> str:
        return " ".join((self.program, *self.args))


def check_of(words: list[str], where: str) -> Check | None:
    """The call that checks a README command, or None for a builtin or an outside tool."""
    program, args = words[0], words[1:]
    if program not in PROJECT:
        return None
    if program == "make":
        return Check("make", ("-n", *args), (), where)
    if program in ("python", "python3"):
        script = args[:2] if args[0] == "-m" else args[:1]
        return Check("python", (*script, "--help"), options_of(args[len(script):]), where)
    # The words before the first option: the subcommand path (and its positional arguments, which --help ignores).
    leading = args[: next((i for i, a in enumerate(args) if a.startswith("-")), len(args))]
    return Check(program, (*leading, "--help"), options_of(args), where)


def options_of(args: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a.split("=")[0] for a in args if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", a)))


def readme_commands() -> list[tuple[str, list[str]]]:
    """(first line of its block, words) of every simple command in the README's bash blocks."""
    return [(str(first_line), words) for first_line, body in bash_blocks(README.read_text(encoding="utf-8"))
            for line in logical_lines(body) for words in commands_of(line)]


def readme_checks() -> list[Check]:
    """One check per distinct call, with the options of every README command it checks and their blocks."""
    merged: dict[tuple[str, ...], Check] = {}
    for check in filter(None, (check_of(words, where) for where, words in readme_commands())):
        key = (check.program, *check.args)
        seen = merged.get(key)
        merged[key] = check if seen is None else Check(
            check.program, check.args, tuple(dict.fromkeys(seen.options + check.options)),
            seen.where if check.where in seen.where.split(", ") else f"{seen.where}, {check.where}")
    return list(merged.values())


# Runs a console script's entry point once per argument list in one process (importing prefect or dvc once, not
# once per command), each call's exit status and output (stdout and stderr) written as JSON to the last argument.
HELP_RUNNER = """
import contextlib, io, json, sys
from importlib.metadata import entry_points
program, calls, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
main = next(iter(entry_points(group="console_scripts", name=program))).load()
results = []
for args in calls:
    sys.argv, captured, code = [program, *args], io.StringIO(), 0
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        try:
            returned = main()
            code = returned if isinstance(returned, int) else 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    results.append([code, captured.getvalue()])
open(out, "w", encoding="utf-8").write(json.dumps(results))
"""


def run_console_script(program: str, checks: list[Check], env: dict[str, str], out: Path) -> list[tuple[int, str]]:
    calls = json.dumps([list(c.args) for c in checks])
    result = subprocess.run([sys.executable, "-c", HELP_RUNNER, program, calls, str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, f"{program}: {result.stderr[-2000:]}"
    return [tuple(r) for r in json.loads(out.read_text(encoding="utf-8"))]


def run_command(check: Check, env: dict[str, str]) -> list[tuple[int, str]]:
    argv = [sys.executable if check.program == "python" else check.program, *check.args]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    return [(result.returncode, result.stdout + result.stderr)]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[tuple[Check, int, str]]:
    """Every check with its exit status and output: a process per console script, in parallel."""
    tmp = tmp_path_factory.mktemp("help")
    # Plain help text (no colours, no wrapping of option names); Prefect's home in a temporary folder.
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200", "DVC_NO_ANALYTICS": "1",
           "PREFECT_HOME": str(tmp / "prefect_home")}
    checks = readme_checks()
    groups = [[c for c in checks if c.program == p] for p in CONSOLE_SCRIPTS]
    groups += [[c] for c in checks if c.program not in CONSOLE_SCRIPTS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = [pool.submit(run_console_script, g[0].program, g, env, tmp / f"{g[0].program}.json")
                if g[0].program in CONSOLE_SCRIPTS else pool.submit(run_command, g[0], env) for g in groups if g]
        outcomes = [outcome for run in runs for outcome in run.result()]
    return [(check, *outcome) for check, outcome in zip([c for g in groups for c in g], outcomes, strict=True)]


def test_every_readme_program_is_the_project_s_a_builtin_or_a_named_outside_tool():
    unknown = {f"README block at line {where}: {words[0]}" for where, words in readme_commands()
               if words[0] not in PROJECT | BUILTINS | EXTERNAL}
    assert not unknown, "programs this test does not know (add them to PROJECT, BUILTINS or EXTERNAL):\n" + \
        "\n".join(sorted(unknown))


def test_the_readme_shows_commands_of_every_program_the_project_installs():
    assert {*CONSOLE_SCRIPTS, "python", "make"} <= {c.program for c in readme_checks()}


def test_every_readme_command_s_help_exits_0(results):
    failed = [f"README block at line {c.where}: {c} exited {rc}: {out.strip()[-300:]}"
              for c, rc, out in results if rc != 0]
    assert not failed, "\n".join(failed)


def test_every_option_a_readme_command_passes_is_in_its_help(results):
    missing = [f"README block at line {c.where}: {c}: {option}"
               for c, rc, out in results if rc == 0
               for option in c.options if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", out)]
    assert not missing, "options the help does not list:\n" + "\n".join(missing)


def test_the_shell_reading_splits_commands_as_bash_does():
    # The reader above is what the other tests stand on: pipes, &&, env assignments, redirections, comments.
    assert commands_of("MT_UID=$(id -u) A=1 docker compose up -d x  # a comment") == [
        ["docker", "compose", "up", "-d", "x"]]
    assert commands_of("cp a b && dvc repro | tee log < in.txt > out.txt") == [
        ["cp", "a", "b"], ["dvc", "repro"], ["tee", "log"]]
    assert logical_lines("hf download x \\\n  --include '*.json'\njq '\n .a\n' > f\n") == [
        "hf download x   --include '*.json'", "jq '\n .a\n' > f"]
    assert shutil.which("make"), "make is what `make run` / `make test` need"
