"""deploy/: every file parses, and every command, queue and probe names something real.

No Docker engine or cluster runs here, so the Compose file is validated against the Compose
specification's JSON schema (tests/deploy/compose-spec.json, from compose-spec/compose-spec
at 170098ba), the Kubernetes manifests structurally, and every ``dormant`` command line is
parsed by the real CLI (``[...args, "--help"]``: an unknown command or option fails).
"""

from __future__ import annotations

import configparser
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kombu.transport.redis import Channel
from typer.testing import CliRunner

from dormant.celery.config import QUEUES, REDIS_PRIORITY_STEPS
from dormant.cli import app

DEPLOY = Path(__file__).parent.parent / "deploy"
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


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    return spec


def test_every_manifest_has_an_api_version_a_kind_and_a_name() -> None:
    docs = manifests()
    assert len(docs) >= 10
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], doc


def test_every_container_runs_a_real_command_of_one_image_with_the_secret() -> None:
    workloads = [*by_kind("Deployment").values(), *by_kind("Job").values()]
    assert {d["metadata"]["name"] for d in workloads} == {
        "dormant-worker",
        "dormant-beat",
        "dormant-flower",
        "dormant-serve",
        "dormant-migrate",
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
