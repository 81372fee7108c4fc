"""``fedsim compose`` for real: a Docker Engine (started here if none runs), fedsim's image built from
``docker/Dockerfile`` offline (a debootstrap base and a wheelhouse, nothing pulled), and the generated
quickstart project (3 SuperNodes, 2 rounds) brought up with Compose: plain and with TLS + SuperNode
auth, it gives ``fedsim run``'s metrics; a run that fails makes ``submit`` exit non-zero; ``down``
leaves no container, network or file of another user behind.

All services share the SuperLink's network namespace, loopback only (``one_network_namespace``):
nothing of theirs reaches beyond it. Run with ``pytest -n 0 -m container`` (in one process: the tests
share one image and one engine; ``.ci/run`` does, after the README's suite); the first run builds
for minutes, later ones reuse the cached base image and wheels.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsim.config import load_config
from fedsim.runner import run
from tests.container_support import (
    TEST_UID,
    Project,
    Unavailable,
    base_image,
    build_image,
    compose_programs,
    docker,
    docker_engine,
    wheelhouse,
)
from tests.test_deploy import assert_same_numbers, metrics

pytestmark = pytest.mark.container

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "configs" / "quickstart.yaml"
SHORT = ["train.rounds=2"]  # the quickstart at 3 nodes (--nodes 3): evaluated at round 2
RUN_TIMEOUT_S = 1200  # a 2-round run takes about a minute here; the machine may be shared


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """fedsim:latest, built here from the repository as it is, on a running engine."""
    try:
        with docker_engine():
            build_image(base_image(), wheelhouse())
            yield "fedsim:latest"
    except Unavailable as why:
        pytest.skip(f"no Docker Engine can run here: {why}")


@pytest.fixture(scope="module")
def compose_program(image: str) -> list[str]:
    programs = compose_programs()
    if not programs:
        pytest.skip("neither docker-compose nor docker compose is installed")
    return next(iter(programs.values()))  # Debian 12's docker-compose 1.29 where both are there


def write_project(tmp_path: Path, *settings: str) -> Path:
    """``fedsim compose`` through the CLI, as a user types it."""
    out = tmp_path / "project"
    cmd = [sys.executable, "-m", "fedsim.cli", "compose", str(QUICKSTART), "--nodes", "3", "--out", str(out),
           "--set", *SHORT, *settings]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return out


@pytest.fixture
def project_of(tmp_path: Path, compose_program: list[str]) -> Iterator:
    """Projects written, run as a host user (not root) and torn down; then checks what is left."""
    made: list[Project] = []
    uid = os.getuid() or TEST_UID

    def make(*settings: str) -> Project:
        made.append(Project(write_project(tmp_path, *settings), compose_program, uid))
        return made[-1]

    yield make
    for project in made:
        project.down()
        assert project.leftovers() == {"containers": [], "networks": []}
        assert project.foreign_files() == []  # nothing root-owned on the host


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """``fedsim run`` on the same config: the numbers every deployment must give."""
    out = tmp_path_factory.mktemp("sim")
    cfg = load_config(QUICKSTART, ["train.num_clients=3", *SHORT, f"output.dir={out}", "output.progress=false"])
    return metrics(Path(run(cfg)["run_dir"]))


def run_to_the_end(project: Project) -> tuple[int, str]:
    project("up", "-d")
    code = project.wait(project.container("submit"), RUN_TIMEOUT_S)
    return code, project.logs("submit")


def test_plain_project_gives_fedsim_runs_metrics(project_of, simulated: list[dict]) -> None:
    project = project_of()
    code, log = run_to_the_end(project)
    assert code == 0, log + project.logs("superlink")
    assert_same_numbers(metrics(project.dir / "runs" / "quickstart"), simulated)
    assert "round 2/2: train loss" in log and "global acc" in log  # what `logs -f submit` shows
    assert "summary: name quickstart" in log and "finished:completed" in log


def test_tls_and_supernode_auth_give_the_same_metrics_and_submit_runs_again(project_of, simulated) -> None:
    project = project_of("deploy.tls=true", "deploy.supernode_auth=true")
    code, log = run_to_the_end(project)
    assert code == 0, log + project.logs("superlink", "register")
    assert_same_numbers(metrics(project.dir / "runs" / "quickstart"), simulated)
    assert docker("inspect", "-f", "{{.State.ExitCode}}", project.container("register")).stdout.strip() == "0"
    for i in range(3):  # registered before they started: no failed activation, no restart
        node = project.container(f"supernode-{i}")
        assert docker("inspect", "-f", "{{.RestartCount}}", node).stdout.strip() == "0"
    superlink = project.logs("superlink")
    assert "SuperNode authentication is disabled" not in superlink and "--insecure" not in superlink

    # a second submit starts a run of its own (no registration to fail) and stops at once on SIGTERM
    again = project("run", "-d", "submit").stdout.split()[-1]
    deadline = time.monotonic() + 300
    while "submitted" not in docker("logs", again).stdout:
        assert time.monotonic() < deadline, docker("logs", again).stdout
        time.sleep(1)
    t0 = time.monotonic()
    docker("stop", "--time", "30", again)
    assert time.monotonic() - t0 < 25  # before docker's 30 s SIGKILL, which the exit code checks
    assert docker("inspect", "-f", "{{.State.ExitCode}}", again).stdout.strip() == "143"  # not 137: killed


def test_a_run_that_fails_makes_submit_exit_non_zero(project_of, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()  # mounted at /data; the file the config names is not there
    project = project_of(f"data.root={tmp_path / 'data' / 'missing.npz'}", "data.dataset=npz")
    code, log = run_to_the_end(project)
    assert code == 1, log
    assert "DataError" in log and "finished:failed" in log
