"""deploy/: every file parses, and every command, queue and probe names something real.

No Docker engine or cluster runs here, so the Compose file is validated against the Compose
specification's JSON schema (tests/deploy/compose-spec.json, from compose-spec/compose-spec
at 170098ba), the Kubernetes manifests against Kubernetes' own schemas (kubernetes-validate,
strict: an unknown field fails; KEDA's ScaledObject, a custom resource, structurally), the
Dockerfile and ``.dockerignore`` by what they say, and every ``dormant`` command line is
parsed by the real CLI (``[...args, "--help"]``: an unknown command or option fails).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kombu.transport.redis import Channel
from typer.testing import CliRunner

from dormant.celery.config import QUEUES, REDIS_PRIORITY_STEPS
from dormant.cli import app

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
CELERY_SUBCOMMANDS = {"worker", "beat", "flower", "inspect"}


def check_command(argv: list[str]) -> None:
    """``argv`` is a real command of this project (a dormant command, or celery on it)."""
    if argv[0] in ("dormant", "/opt/dormant/.venv/bin/dormant"):
        result = CliRunner().invoke(app, [*argv[1:], "--help"])
        assert result.exit_code == 0, f"{argv}: {result.output}"
    elif argv[0] == "celery":
        assert argv[1:3] == ["-A", "dormant.worker"], argv
        assert argv[3] in CELERY_SUBCOMMANDS, argv
    else:
        raise AssertionError(f"not a dormant or celery command: {argv}")


def test_check_command_refuses_what_dormant_does_not_have() -> None:
    with pytest.raises(AssertionError):
        check_command(["dormant", "serve", "--bogus"])
    with pytest.raises(AssertionError):
        check_command(["dormant", "worker-pool"])
    check_command(["dormant", "db", "upgrade"])


# compose -----------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def test_the_compose_file_is_valid_against_the_compose_specification() -> None:
    schema = json.loads((Path(__file__).parent / "deploy" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)  # the draft the specification declares
    validator.validate(compose())
    broken = {**compose(), "services": {"worker": {"image": "x", "replicas": "two"}}}
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(broken)


def test_compose_runs_every_part_with_real_commands_after_the_migration() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "worker", "beat", "flower", "serve"}
    assert services["migrate"]["command"] == ["dormant", "db", "upgrade"]
    assert services["migrate"]["restart"] == "no"
    for name in ("worker", "beat", "flower", "serve"):
        check_command(services[name]["command"])
        after = services[name]["depends_on"]["migrate"]["condition"]
        assert after == "service_completed_successfully", name
        assert services[name]["image"] == services["migrate"]["image"]
    assert services["beat"]["deploy"]["replicas"] == 1
    assert "healthcheck" in services["serve"]
    assert "/readyz" in " ".join(services["serve"]["healthcheck"]["test"])


# kubernetes --------------------------------------------------------------------------


def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def name_of(doc: dict[str, Any]) -> str:
    """A manifest's name, or the prefix of the names generated for it."""
    name: str = doc["metadata"].get("name") or doc["metadata"]["generateName"]
    return name


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {name_of(d): d for d in manifests() if d["kind"] == kind}


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    return spec


def test_every_manifest_has_an_api_version_a_kind_and_a_name() -> None:
    docs = manifests()
    assert len(docs) >= 10
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and name_of(doc), doc


def test_every_container_runs_a_real_command_of_one_image_with_the_secret() -> None:
    workloads = [*by_kind("Deployment").values(), *by_kind("Job").values()]
    assert {name_of(d) for d in workloads} == {
        "dormant-worker",
        "dormant-beat",
        "dormant-flower",
        "dormant-serve",
        "dormant-migrate-",
    }
    images = set()
    for doc in workloads:
        for container in containers(doc):
            check_command(container["command"])
            images.add(container["image"])
            assert {"secretRef": {"name": "dormant"}} in container["envFrom"]
    assert len(images) == 1
    secret = by_kind("Secret")["dormant"]["stringData"]
    assert "DORMANT_SECRET_KEY" in secret and "DORMANT_DATABASE_URL" in secret


def test_deployments_select_their_own_pods_and_services_and_budgets_select_deployments() -> None:
    deployments = by_kind("Deployment")
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in deployments.values()]
    for doc in deployments.values():
        selected = doc["spec"]["selector"]["matchLabels"]
        assert selected.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
    for service in by_kind("Service").values():
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pod_labels), service
    for budget in by_kind("PodDisruptionBudget").values():
        selector = budget["spec"]["selector"]["matchLabels"]
        assert any(selector.items() <= labels.items() for labels in pod_labels), budget
    assert "dormant-worker" in by_kind("PodDisruptionBudget")


def test_beat_is_exactly_one_replica_replaced_by_recreation() -> None:
    beat = by_kind("Deployment")["dormant-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    targets = [s["spec"]["scaleTargetRef"]["name"] for s in by_kind("ScaledObject").values()]
    assert "dormant-beat" not in targets


def test_long_running_parts_have_liveness_and_readiness_probes() -> None:
    for name in ("dormant-worker", "dormant-flower", "dormant-serve"):
        for container in containers(by_kind("Deployment")[name]):
            assert "livenessProbe" in container and "readinessProbe" in container, name
    serve = containers(by_kind("Deployment")["dormant-serve"])[0]
    assert serve["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert serve["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert serve["command"][-1] == str(serve["ports"][0]["containerPort"])


def test_keda_scales_workers_to_zero_on_every_redis_list_of_dormants_queues() -> None:
    scaled = by_kind("ScaledObject")["dormant-worker"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "dormant-worker"
    assert scaled["spec"]["minReplicaCount"] == 0
    lists = {t["metadata"]["listName"] for t in scaled["spec"]["triggers"]}
    assert all(t["type"] == "redis" for t in scaled["spec"]["triggers"])
    channel = Channel.__new__(Channel)
    channel.priority_steps = list(REDIS_PRIORITY_STEPS)
    expected = {
        channel._q_for_pri(queue, step) for queue in QUEUES for step in REDIS_PRIORITY_STEPS
    }
    assert lists == expected


KUBERNETES_VERSION = "1.31.0"
"""The oldest Kubernetes release still in wide support when these manifests were written."""


def test_every_kubernetes_manifest_is_valid_against_the_kubernetes_schemas() -> None:
    checked = 0
    for doc in manifests():
        if doc["kind"] == "ScaledObject":
            continue  # KEDA's custom resource: no schema ships with Kubernetes
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked == len(manifests()) - 1
    worker = by_kind("Deployment")["dormant-worker"]
    typo = {**worker, "spec": {**worker["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES_VERSION, strict=True)


def test_worker_probes_ping_the_pods_own_node_without_importing_the_agents() -> None:
    """Importing the agents module lists every MCP server (twice a probe's time) and fails
    when one is down, which would restart healthy workers: the probe empties DORMANT_AGENTS,
    so ``dormant.worker`` builds its app without agents (tests/celery/test_celery_probe.py
    runs the command against a real worker)."""
    worker = containers(by_kind("Deployment")["dormant-worker"])[0]
    for probe in ("livenessProbe", "readinessProbe"):
        shell, flag, line = worker[probe]["exec"]["command"]
        assert (shell, flag) == ("sh", "-c")
        argv = shlex.split(line)
        assert argv[0] == "DORMANT_AGENTS=", line
        assert argv[1:6] == ["celery", "-A", "dormant.worker", "inspect", "ping"], line
        assert argv[argv.index("-d") + 1] == "celery@$HOSTNAME", line


def test_every_pod_runs_as_the_images_numeric_non_root_user() -> None:
    users = re.findall(r"^USER (\S+)$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    assert len(users) == 1 and re.fullmatch(r"[1-9]\d*(:\d+)?", users[0]), users
    for doc in [*by_kind("Deployment").values(), *by_kind("Job").values()]:
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name_of(doc)


# the image ---------------------------------------------------------------------------


def test_the_image_installs_the_locked_dependencies_with_uv_and_the_extras_it_runs() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    syncs = re.findall(r"^RUN uv sync (.*)$", dockerfile, re.MULTILINE)
    assert len(syncs) == 2, dockerfile
    for sync in syncs:
        argv = shlex.split(sync)
        assert "--locked" in argv and "--no-dev" in argv, sync  # exactly uv.lock's versions
        assert "--frozen" not in argv, sync  # --frozen installs a stale lock without a word
        extras = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--extra"}
        assert extras == {"serve", "flower", "mcp"}, sync  # dormant serve, Flower, MCP tools
        assert extras <= set(pyproject["project"]["optional-dependencies"])
    assert "pip install ." not in dockerfile and 'pip install ".[' not in dockerfile
    uv_pin = re.search(r'"uv==([\d.]+)"', (ROOT / "Makefile").read_text())
    assert uv_pin and f'"uv=={uv_pin[1]}"' in dockerfile  # the uv that wrote the lock


def _docker_ignores(patterns: list[str], path: str) -> bool:
    """Docker's rule, as far as these patterns use it: ``*`` within a path segment, ``**``
    across segments, and a match on a directory leaves out everything under it."""
    parts = path.split("/")
    for pattern in patterns:
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            return True
    return False


def test_the_docker_context_leaves_out_environments_databases_keys_and_secrets() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not [p for p in patterns if p.startswith("!")]  # the simple rule above holds
    for left_out in (
        ".venv/lib/python3.11/site-packages/celery/app.py",
        ".uv/bin/uv",
        ".git/HEAD",
        "dormant-demo.db",
        "dormant-demo.db.key",
        "examples/django_app/shop.db",
        "bench/.venv-langgraph/bin/python",
        "dormant/__pycache__/worker.cpython-312.pyc",
        "deploy/.env",
    ):
        assert _docker_ignores(patterns, left_out), left_out
    for left_out in ("tests/test_deploy.py", "bench/run.py", "docs/deploy.md"):
        assert _docker_ignores(patterns, left_out), left_out  # no process runs them
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    packages = wheel["targets"]["wheel"]["packages"]  # what the image's install builds
    for kept in (
        "pyproject.toml",
        "uv.lock",
        "README.md",
        "myapp/agents.py",
        *(f"{package}/__init__.py" for package in packages),
    ):
        assert not _docker_ignores(patterns, kept), kept


# systemd -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["worker", "beat", "serve"])
def test_systemd_units_run_real_commands_and_restart(name: str) -> None:
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((DEPLOY / "systemd" / f"dormant-{name}.service").read_text())
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[1] == name
    check_command(argv)
    assert service["Restart"] == "always"
    assert service["EnvironmentFile"] == "/etc/dormant/dormant.env"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


# what issue 31 found -------------------------------------------------------------------


def test_uv_sync_locked_refuses_a_stale_lock_where_frozen_installs_it(tmp_path: Path) -> None:
    """The Dockerfile's ``uv sync`` line, run (dry, offline) on a copy of the project whose
    ``pyproject.toml`` asks for a dependency ``uv.lock`` does not have."""
    uv = ROOT / ".uv" / "bin" / "uv"
    if not uv.exists():
        found = shutil.which("uv")
        if found is None:
            pytest.skip("!!! no uv (make .venv/.synced installs it): stale-lock case NOT RUN")
        uv = Path(found)
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    first = shlex.split(re.findall(r"^RUN uv sync (.*)$", dockerfile, re.MULTILINE)[0])
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}

    def sync(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(uv), "sync", *args, "--offline", "--dry-run"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    fresh = sync(*first)
    assert fresh.returncode == 0, fresh.stderr
    pyproject = (tmp_path / "pyproject.toml").read_text()
    stale = pyproject.replace("dependencies = [", 'dependencies = [\n    "not-in-the-lock>=1",', 1)
    assert stale != pyproject
    (tmp_path / "pyproject.toml").write_text(stale)
    refused = sync(*first)
    assert refused.returncode != 0, refused.stdout
    frozen = [arg if arg != "--locked" else "--frozen" for arg in first]
    assert sync(*frozen).returncode == 0  # what the Dockerfile used to do: no error


def test_keda_alone_sets_the_worker_replicas() -> None:
    worker = by_kind("Deployment")["dormant-worker"]
    assert "replicas" not in worker["spec"]  # re-applied, it would fight KEDA's count
    assert by_kind("ScaledObject")["dormant-worker"]["spec"]["scaleTargetRef"]["name"] == (
        "dormant-worker"
    )


def test_flower_runs_without_the_agents_in_compose_and_kubernetes() -> None:
    """Flower needs the broker; importing the agents would list every MCP server and stop
    it while one is down."""
    assert compose()["services"]["flower"]["environment"]["DORMANT_AGENTS"] == ""
    (flower,) = containers(by_kind("Deployment")["dormant-flower"])
    assert {"name": "DORMANT_AGENTS", "value": ""} in flower["env"]


def test_the_migration_job_gets_a_new_name_per_release_and_says_how_to_run_it() -> None:
    (job,) = by_kind("Job").values()
    assert "name" not in job["metadata"] and job["metadata"]["generateName"] == "dormant-migrate-"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    text = (KUBERNETES / "migrate-job.yaml").read_text()
    assert "kubectl create -f deploy/kubernetes/migrate-job.yaml" in text
    assert (
        "kubectl create -f deploy/kubernetes/migrate-job.yaml"
        in (ROOT / "docs" / "deploy.md").read_text()
    )


def _final_stage(dockerfile: str) -> str:
    return dockerfile.rsplit("\nFROM ", 1)[1]


def test_the_images_user_has_a_writable_home_with_the_caches_and_uvx() -> None:
    final = _final_stage((DEPLOY / "Dockerfile").read_text())
    useradd = re.search(r"useradd (.*)", final)
    assert useradd is not None
    argv = shlex.split(useradd[1])
    home = argv[argv.index("--home-dir") + 1]
    assert "--create-home" in argv and "--no-create-home" not in argv
    env = dict(
        re.findall(r"(\w+)=(\S+)", " ".join(re.findall(r"^ENV (.*(?:\n +.*)*)", final, re.M)))
    )
    assert env["HOME"] == home
    for cache in ("XDG_CACHE_HOME", "UV_CACHE_DIR", "npm_config_cache"):
        assert env[cache].startswith(home + "/"), cache
    assert re.search(r"^COPY --from=build \S*/uv \S*/uvx ", final, re.M), final
    assert "--chown" not in final  # /app, the code, stays read-only to the user


@pytest.mark.parametrize("name", ["worker", "beat", "serve"])
def test_systemd_units_give_home_and_caches_writable_directories(name: str) -> None:
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((DEPLOY / "systemd" / f"dormant-{name}.service").read_text())
    service = unit["Service"]
    assert service["ProtectSystem"] == "strict"  # everything else is read-only
    env = dict(pair.split("=", 1) for pair in shlex.split(service["Environment"]))
    assert env["HOME"] == f"/var/lib/{service['StateDirectory']}"
    for cache in ("XDG_CACHE_HOME", "UV_CACHE_DIR", "npm_config_cache"):
        assert env[cache].startswith(f"/var/cache/{service['CacheDirectory']}"), cache


def test_docs_deploy_names_every_variable_compose_reads_and_the_systemd_setup() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    read = set(re.findall(r"\$\{(\w+)", (DEPLOY / "compose.yaml").read_text()))
    assert "DORMANT_IMAGE" in read
    assert {v for v in read if f"`{v}`" not in doc} == set()
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.read_string((DEPLOY / "systemd" / "dormant-worker.service").read_text())
    venv = shlex.split(unit["Service"]["ExecStart"])[0].rsplit("/bin/", 1)[0]
    user = unit["Service"]["User"]
    assert f"useradd --system --home-dir /var/lib/dormant --shell /usr/sbin/nologin {user}" in doc
    assert f"python3 -m venv {venv}" in doc
