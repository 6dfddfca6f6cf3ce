"""The Kubernetes worker probe, run as the kubelet runs it, against a real worker: it answers
without importing the agents module (a module that cannot be imported here, as one listing a
down MCP server cannot), so a broken MCP server never restarts a healthy worker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from conftest import QUEUES, ROOT, Deployment, scaled


def probe_command(kind: str) -> list[str]:
    manifest = next(
        yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "worker.yaml").read_text())
    )
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    command: list[str] = container[kind]["exec"]["command"]
    return command


def test_the_worker_probe_answers_without_importing_the_agents_module(
    deploy: Callable[..., Deployment],
) -> None:
    d = deploy()
    pod = f"dormant-worker-{d.prefix}"  # the pod's HOSTNAME; `dormant worker` is celery@it
    argv = ["-A", "dormant.worker", "worker", "-P", "threads", "-c", "2", "-Q", QUEUES]
    argv += ["-n", f"celery@{pod}", "-l", "warning", "--without-gossip", "--without-mingle"]
    d.wait_ready(d._start("w1", argv, {"TEST_WORKER_ID": "w1"}))
    bin_dir = str(Path(sys.executable).parent)  # where the image has celery: on PATH
    env = {
        **os.environ,
        **d.env,
        "HOSTNAME": pod,
        "DORMANT_AGENTS": "broken_agents",
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
    }
    for kind in ("livenessProbe", "readinessProbe"):
        probe = subprocess.run(
            probe_command(kind),
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
        output = probe.stdout + probe.stderr
        assert probe.returncode == 0, f"{kind} failed:\n{output}"
        assert f"celery@{pod}: OK" in output and "pong" in output, output
        assert "MCP server" not in output, output
