"""``fedsim compose`` for real: a Docker Engine (started here if none runs), fedsim's image built from
``docker/Dockerfile`` offline (a debootstrap base and a wheelhouse, nothing pulled), and the generated
quickstart project (3 SuperNodes, 2 rounds) brought up with Compose: plain and with TLS + SuperNode
auth, under docker-compose 1.29 and Compose v2, it gives ``fedsim run``'s metrics; so does
docs/deployment.md's recipe across hosts (two projects, the SuperLink's and the SuperNodes', in network
namespaces of their own linked by a veth pair), and a run whose SuperLink is killed, resumed with
``docker compose run --rm submit --resume``; a run that fails makes ``submit`` exit non-zero; ``down``
leaves no container, network or file of another user behind.

All services share the SuperLink's network namespace, loopback only (``one_network_namespace``), or, as
two hosts, two namespaces and the veth between them: nothing of theirs reaches beyond. Run with
``pytest -n 0 -m container`` (in one process: the tests share one image and one engine; ``.ci/run``
does, after the README's suite); the first run builds for minutes, later ones reuse the cached base
image and wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fedsim.config_file import load_config
from fedsim.engines.runner import run
from fedsim.record.checkpoint import Checkpoint
from tests.container_support import (
    NETNS,
    TEST_UID,
    Project,
    Services,
    Unavailable,
    base_image,
    build_image,
    compose_programs,
    docker,
    docker_engine,
    fetch_compose_v2,
    nodes_host,
    one_network_namespace,
    received_bytes,
    superlink_host,
    veth,
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


# the Compose programs the generated file is for: Debian 12's, and Compose v2 (fetched from Debian 13 where not
# installed). The plain and the TLS projects run under both; the other tests, which add nothing a Compose program
# reads differently (a failing run, two hosts, a killed SuperLink), under Compose v2 alone
BOTH_PROGRAMS = pytest.mark.parametrize("compose_program", ["docker-compose 1.29", "compose v2"], indirect=True)


@pytest.fixture(scope="module")
def compose_program(request: pytest.FixtureRequest, image: str) -> list[str]:
    """The Compose program a test runs under: its parameter (:data:`BOTH_PROGRAMS`), else Compose v2."""
    name = getattr(request, "param", "compose v2")
    if name == "compose v2":
        try:
            fetch_compose_v2()
        except Unavailable as why:
            pytest.skip(str(why))
    programs = compose_programs()
    if name not in programs:
        pytest.skip(f"{name} is not installed")
    return programs[name]


def write_project(tmp_path: Path, *settings: str, options: tuple[str, ...] = (), short: bool = True) -> Path:
    """``fedsim compose`` through the CLI, as a user types it (``tests.plugins`` importable, for their strategies);
    ``short``: with ``SHORT``'s rounds (a setting may be given once)."""
    out = tmp_path / "project"
    cmd = [sys.executable, "-m", "fedsim.app.cli", "compose", str(QUICKSTART), "--nodes", "3", "--out", str(out),
           *options, "--set", *(SHORT if short else []), *settings]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    return out


@pytest.fixture
def projects(compose_program: list[str]) -> Iterator[Callable[..., Project]]:
    """Projects run as a host user (not root) and torn down; then checks what is left."""
    made: list[Project] = []
    uid = os.getuid() or TEST_UID

    def make(directory: Path, services: Services | None = None, name: str | None = None) -> Project:
        made.append(Project(directory, compose_program, uid, services, name))
        return made[-1]

    yield make
    for project in made:
        project.down()
        assert project.leftovers() == {"containers": [], "networks": []}
        assert project.foreign_files() == []  # nothing root-owned on the host


@pytest.fixture
def project_of(tmp_path: Path, projects: Callable[..., Project]) -> Callable[..., Project]:
    """The quickstart's project with these ``--set`` settings, run in one network namespace."""
    return lambda *settings: projects(write_project(tmp_path, *settings))


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


@BOTH_PROGRAMS
def test_plain_project_gives_fedsim_runs_metrics(project_of, simulated: list[dict]) -> None:
    project = project_of()
    code, log = run_to_the_end(project)
    assert code == 0, log + project.logs("superlink")
    assert_same_numbers(metrics(project.dir / "runs" / "quickstart"), simulated)
    assert "round 2/2: train loss" in log and "global acc" in log  # what `logs -f submit` shows
    assert "summary: name quickstart" in log and "finished:completed" in log


@BOTH_PROGRAMS
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


SERVER = "server.fedsim.test"  # the SuperLink's host as the nodes' hosts name it (their /etc/hosts, as DNS would)


def test_across_two_hosts_as_the_docs_say_with_tls_and_supernode_auth(
    tmp_path: Path, projects: Callable[..., Project], simulated: list[dict]
) -> None:
    """docs/deployment.md's recipe across hosts: one project written with ``--superlink-host``, copied to the
    nodes' host; there only the SuperNodes run, here the rest; the two hosts are network namespaces of their
    own, each with loopback and one end of a veth pair; the certificate names the SuperLink's host."""
    tls = ["deploy.tls=true", "deploy.supernode_auth=true", "deploy.address=0.0.0.0"]
    written = write_project(tmp_path, *tls, options=("--superlink-host", SERVER))
    copied = shutil.copytree(written, tmp_path / "nodes-host", symlinks=True)  # "copy the directory to every host"
    server = projects(written, superlink_host(written, SERVER))
    # one engine plays both hosts here, so the nodes' project needs a name of its own
    nodes = projects(copied, nodes_host(copied, SERVER), name=f"{server.name}-nodes")

    server("up", "-d", "superlink", "register")  # on the SuperLink's host
    nodes("up", "-d", NETNS)  # the nodes' host's network, before its SuperNodes join it
    with veth(server.pid("superlink"), nodes.pid(NETNS)) as link:
        assert server.wait(server.container("register"), RUN_TIMEOUT_S) == 0, server.logs("register", "superlink")
        nodes("up", "-d", "--no-deps", "supernode-0", "supernode-1", "supernode-2")  # on the nodes' host
        received = received_bytes(server.pid("superlink"), link)
        res = server("run", "--rm", "-T", "submit", timeout=RUN_TIMEOUT_S, check=False)
        assert res.returncode == 0, res.stdout[-3000:] + server.logs("superlink") + nodes.logs()
        run_dir = server.dir / "runs" / "quickstart"
        # the SuperNodes' replies (their models) came in over the veth: their namespace is not the SuperLink's
        assert received_bytes(server.pid("superlink"), link) - received > (run_dir / "model.pt").stat().st_size
    assert_same_numbers(metrics(run_dir), simulated)
    assert "round 2/2: train loss" in res.stdout and "finished:completed" in res.stdout
    network = {os.readlink(f"/proc/{nodes.pid(f'supernode-{i}')}/ns/net") for i in range(3)}
    assert network == {os.readlink(f"/proc/{nodes.pid(NETNS)}/ns/net")}
    node_log = nodes.logs("supernode-0")
    assert "--insecure" not in node_log and "TLS disabled" not in node_log and "SuperNode ID" in node_log
    assert "SuperNode authentication is disabled" not in server.logs("superlink")


def with_test_plugins(services: Services) -> Services:
    """``services`` with tests/plugins importable in the SuperLink and the SuperNodes, which run its strategy;
    the SuperLink under docker-init: PID 1 of a container ignores a SIGKILL sent from inside it, as the
    killing plugin sends one, and the SuperLink's death then ends its container as a host failure would."""
    plugins = {"volumes": [f"{REPO / 'tests'}:/opt/fedsim-tests/tests:ro"],
               "environment": {"PYTHONPATH": "/opt/fedsim-tests"}}  # fmt: skip
    for name, service in services.items():
        if name == "superlink" or name.startswith("supernode-"):
            service.update(plugins)
    services["superlink"]["init"] = True
    return services


def test_a_run_whose_superlink_is_killed_resumes_with_submit_resume_to_fedsim_runs_metrics(
    tmp_path: Path, projects: Callable[..., Project]
) -> None:
    """SCAFFOLD (its c_i in each SuperNode's ``state/``) whose ServerApp SIGKILLs the SuperLink and itself as round
    2 of 3 starts, after round 1's checkpoint (tests/plugins/superlink_killer.py: at that round on any machine),
    continued with docs/deployment.md's commands: new SuperLink and SuperNodes, then ``submit --resume``."""
    every_round = ["train.rounds=3", "eval.every=1", "output.checkpoint_every=1"]
    killer = ["strategy.name=tests.plugins.superlink_killer:KillSuperLink", "strategy.kill_round=2"]
    auth = ["deploy.tls=true", "deploy.supernode_auth=true"]
    written = write_project(tmp_path, *every_round, *killer, *auth, short=False)
    project = projects(written, with_test_plugins(one_network_namespace(written)))
    project("up", "-d")
    assert project.wait(project.container("submit"), RUN_TIMEOUT_S) == 2, project.logs("submit", "superlink")
    assert project.wait(project.container("superlink"), 120) == 137  # docker-init's status: its child SIGKILLed
    run_dir = project.dir / "runs" / "quickstart"
    assert Checkpoint.load(run_dir).round == 1 and not (run_dir / "summary.json").exists()
    # each client's c_i on its node's host: state/supernode-<i>/<run key>/partition-<i>/round-1.bin
    states = [p.relative_to(project.dir / "state").parts for p in (project.dir / "state").rglob("round-*.bin")]
    assert sorted((node, partition, name) for node, _, partition, name in states) == [
        (f"supernode-{i}", f"partition-{i}", "round-1.bin") for i in range(3)
    ]

    project("up", "-d", "--force-recreate", "--scale", "submit=0")  # the documented commands
    res = project("run", "--rm", "-T", "submit", "--resume", timeout=RUN_TIMEOUT_S, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + project.logs("superlink")
    assert "resumed from its checkpoint" in res.stdout and "round 3/3: train loss" in res.stdout
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_round"] == 1

    out = tmp_path / "sim"
    plain = ["train.num_clients=3", *every_round, "strategy.name=scaffold", f"output.dir={out}"]
    simulated = metrics(Path(run(load_config(QUICKSTART, [*plain, "output.progress=false"]))["run_dir"]))
    assert [m["round"] for m in simulated] == [1, 2, 3]
    assert_same_numbers(metrics(run_dir), simulated)
