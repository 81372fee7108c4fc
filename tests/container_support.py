"""What the container test needs around it: a Docker Engine, Debian's tools, the offline base image, a
wheelhouse, fedsim's image built from ``docker/Dockerfile``, and Compose projects run and torn down.

Nothing is pulled and nothing is downloaded inside a build: the base image comes from
``docker/debian-base.sh`` (debootstrap from Debian's packages), the wheels from
``docker/wheelhouse.py`` (the installed versions, from the package index). Both are cached between
runs: the base image by its tag, the wheels in ``$FEDSIM_DOCKER_CACHE`` (default
``~/.cache/fedsim-docker``).

``python3 -m tests.container_support`` prepares all of it ahead of the test (tools, base image, wheels, the
image, Compose v2), then stops the engine it started: ``.ci/run`` does so beside the other test stages, whose
work is the CPU's where this is mostly the network's and the disk's; the test then finds it cached.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FEDSIM_DOCKER_CACHE") or "~/.cache/fedsim-docker").expanduser()
BASE_IMAGE = "fedsim-base:bookworm"
IMAGE = "fedsim:latest"  # what the generated compose file runs
DEPENDENCIES_IMAGE = "fedsim-dependencies:cache"  # the Dockerfile's first stage, kept as the next build's cache
DEBIAN_PACKAGES = {"dockerd": "docker.io", "docker-compose": "docker-compose", "debootstrap": "debootstrap"}
TEST_UID = 4242  # the host user the test's projects belong to when the test runs as root


class Unavailable(Exception):
    """No Docker Engine can run here: the reason to skip."""


def sh(cmd: list[str], timeout: float, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh(["docker", *args], timeout, check)


# --- the engine -------------------------------------------------------------------------------------


def install_missing_tools() -> None:
    """Debian's docker.io, docker-compose and debootstrap, if any is missing and apt-get can install it."""
    missing = sorted({pkg for tool, pkg in DEBIAN_PACKAGES.items() if shutil.which(tool) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable(f"{', '.join(missing)} missing and no apt-get as root to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sh(["apt-get", "update", "-qq"], 600, env=env)
    sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], 900, env=env)


def engine_answers() -> bool:
    return shutil.which("docker") is not None and docker("info", timeout=60, check=False).returncode == 0


@contextmanager
def docker_engine() -> Iterator[None]:
    """The running Docker Engine, or one started here and stopped afterwards: no default bridge, no
    iptables rules, no NAT (this machine's firewall is left as it is)."""
    install_missing_tools()
    if engine_answers():
        yield
        return
    if os.geteuid() != 0:
        raise Unavailable("no Docker Engine answers and only root can start one")
    CACHE.mkdir(parents=True, exist_ok=True)
    log = open(CACHE / "dockerd.log", "ab")  # noqa: SIM115 (the daemon writes it until it stops)
    proc = subprocess.Popen(
        ["dockerd", "--bridge=none", "--iptables=false", "--ip-masq=false"], stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    log.close()
    try:
        deadline = time.monotonic() + 180
        while not engine_answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (CACHE / "dockerd.log").read_text(errors="replace")[-1500:]
                raise Unavailable(f"dockerd could not start here (exit {proc.poll()}): {tail}")
            time.sleep(1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- images -----------------------------------------------------------------------------------------


def base_image() -> str:
    """The debootstrap base image, made once and then found by its tag."""
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        sh(["sh", str(REPO / "docker" / "debian-base.sh"), BASE_IMAGE], 1200)
    return BASE_IMAGE


def wheelhouse() -> Path:
    """Wheels of the installed versions (only the missing ones are fetched)."""
    wheels = CACHE / "wheels"
    sh([sys.executable, str(REPO / "docker" / "wheelhouse.py"), str(wheels)], 1800)
    return wheels


def build_image(base: str, wheels: Path) -> None:
    """``docker/Dockerfile`` itself, with the offline base and the wheelhouse in its build context."""
    target = REPO / "docker" / "wheels"
    linked = []
    try:
        for wheel in wheels.glob("*.whl"):
            dest = target / wheel.name
            if not dest.exists():
                try:
                    os.link(wheel, dest)  # no copy of gigabytes where the cache shares the file system
                except OSError:
                    shutil.copyfile(wheel, dest)
                linked.append(dest)
        build = ["build", "--force-rm", "-f", str(REPO / "docker" / "Dockerfile"), "--build-arg", f"BASE_IMAGE={base}"]
        # the dependencies stage tagged first: the prune below keeps it, and with it the build cache of its
        # layers (gigabytes of wheels installed), so a later build redoes only fedsim's own layers
        docker(*build, "--target", "dependencies", "-t", DEPENDENCIES_IMAGE, str(REPO), timeout=2400)
        docker(*build, "-t", IMAGE, str(REPO), timeout=2400)
    finally:
        for dest in linked:
            dest.unlink(missing_ok=True)
        # the images this build replaced, and a failed build's layers, are untagged now: 5-8 GB each, gone so
        # that repeated builds do not fill the disk
        docker("image", "prune", "--force", timeout=600, check=False)


# --- Compose projects -------------------------------------------------------------------------------


COMPOSE_V2 = CACHE / "compose-v2" / "usr" / "libexec" / "docker" / "cli-plugins" / "docker-compose"
COMPOSE_V2_SUITE = "trixie"  # Debian 13, whose docker-compose package is Compose v2 (Debian 12's is 1.29)


def fetch_compose_v2() -> None:
    """Compose v2 where ``docker compose`` is not installed: Debian 13's docker-compose package (a static
    binary) downloaded with apt-get into the cache and unpacked there, not installed (this machine stays
    Debian 12). Raises Unavailable where apt-get cannot run or reach Debian."""
    if COMPOSE_V2.exists() or sh(["docker", "compose", "version"], 60, check=False).returncode == 0:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable("no docker compose, and no apt-get as root to fetch Debian's Compose v2")
    apt = CACHE / f"apt-{COMPOSE_V2_SUITE}"
    (apt / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(f"deb http://deb.debian.org/debian {COMPOSE_V2_SUITE} main\n")
    options = [f"Dir::Etc::SourceList={apt / 'sources.list'}", "Dir::Etc::SourceParts=/nonexistent",
               f"Dir::State::Lists={apt / 'lists'}", f"Dir::Cache={apt}", "Dir::State::status=/dev/null",
               "Debug::NoLocking=1"]  # fmt: skip
    apt_get = ["apt-get", "-qq", *(arg for opt in options for arg in ("-o", opt))]
    for cmd in ([*apt_get, "update"], [*apt_get, "download", "docker-compose"]):
        if (res := sh(cmd, 600, check=False, cwd=apt)).returncode != 0:
            raise Unavailable(f"Debian's Compose v2 could not be fetched: {res.stderr.strip()[-500:]}")
    (deb,) = apt.glob("docker-compose_*.deb")
    sh(["dpkg", "-x", str(deb), str(CACHE / "compose-v2")], 120)
    deb.unlink()


def compose_programs() -> dict[str, list[str]]:
    """The Compose implementations here: Debian 12's docker-compose 1.29, and Compose v2 (``docker compose``
    where installed, else the binary :func:`fetch_compose_v2` unpacked)."""
    found = {}
    if shutil.which("docker-compose") and sh(["docker-compose", "version"], 60, check=False).returncode == 0:
        found["docker-compose 1.29"] = ["docker-compose"]
    if sh(["docker", "compose", "version"], 60, check=False).returncode == 0:
        found["compose v2"] = ["docker", "compose"]
    elif COMPOSE_V2.exists() and sh([str(COMPOSE_V2), "version"], 60, check=False).returncode == 0:
        found["compose v2"] = [str(COMPOSE_V2)]
    return found


OVERRIDE = "test-override.yaml"  # the test's compose file on top of the generated one
Services = dict[str, dict[str, object]]


def one_network_namespace(project: Path) -> Services:
    """The test's override: every service in the SuperLink's network namespace, which has loopback only
    (no network of Docker's, no published port; ``superlink`` names 127.0.0.1 there). This machine's
    firewall drops bridge traffic between containers; the generated file stays the one users run."""
    services = yaml.safe_load((project / "compose.yaml").read_text())["services"]
    override: Services = {"superlink": {"network_mode": "none", "extra_hosts": ["superlink:127.0.0.1"]}}
    for name in services:
        if name != "superlink":
            override[name] = {"network_mode": "service:superlink"}
    return override


# --- two "hosts": two projects in network namespaces of their own, linked by a veth pair --------------

SUPERLINK_ADDRESS, NODES_ADDRESS = "10.77.0.1", "10.77.0.2"  # the veth's two ends, a /30 of the test's own
NETNS = "netns"  # the nodes' host's network: a service that only holds a namespace for the SuperNodes to join


def superlink_host(project: Path, name: str) -> Services:
    """The SuperLink's host: its services in the SuperLink's namespace (loopback, then the veth), where
    ``name``, the host name the project was generated with, is the veth's address."""
    override = one_network_namespace(project)
    override["superlink"]["extra_hosts"] = ["superlink:127.0.0.1", f"{name}:{SUPERLINK_ADDRESS}"]
    return override


def nodes_host(project: Path, name: str) -> Services:
    """A client host: its SuperNodes in the namespace of a ``netns`` service (loopback, then the veth), where
    ``name`` resolves to the SuperLink's end of the veth. docker-init as its PID 1 ends it on SIGTERM."""
    holder = {"image": IMAGE, "network_mode": "none", "extra_hosts": [f"{name}:{SUPERLINK_ADDRESS}"],
              "entrypoint": ["sleep", "infinity"], "init": True}  # fmt: skip
    override: Services = {NETNS: holder}
    services = yaml.safe_load((project / "compose.yaml").read_text())["services"]
    for service in services:
        if service.startswith("supernode-"):
            override[service] = {"network_mode": f"service:{NETNS}"}
    return override


def ip(*args: str, pid: int | None = None) -> None:
    """``ip`` here, or in the network namespace of process ``pid``."""
    sh([*(["nsenter", "-t", str(pid), "-n"] if pid else []), "ip", *args], 60)


@contextmanager
def veth(superlink_pid: int, nodes_pid: int) -> Iterator[str]:
    """A veth pair from the SuperLink's network namespace (``SUPERLINK_ADDRESS``) to the nodes' (``NODES_ADDRESS``),
    as tests/test_deploy.py links the namespace of its SuperNodes; yields the SuperLink's end. Each end goes
    with its namespace; an end still here (a step failed) is deleted, and with it the pair."""
    tag = os.getpid() % 100000
    ends = (f"fsc{tag}l", f"fsc{tag}n")
    ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
    try:
        for end, pid, address in zip(ends, (superlink_pid, nodes_pid), (SUPERLINK_ADDRESS, NODES_ADDRESS), strict=True):
            ip("link", "set", end, "netns", str(pid))
            ip("addr", "add", f"{address}/30", "dev", end, pid=pid)
            ip("link", "set", end, "up", pid=pid)
        yield ends[0]
    finally:
        for end in ends:
            sh(["ip", "link", "del", end], 60, check=False)


def received_bytes(pid: int, interface: str) -> int:
    """What ``interface`` in the network namespace of process ``pid`` has received."""
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == interface:
            return int(counters.split()[0])
    raise AssertionError(f"no {interface} in the network namespace of {pid}")


# --- Compose projects, run -------------------------------------------------------------------------


class Project:
    """A generated Compose project, run with one Compose program as the host user ``uid``, with the test's
    override ``services`` (default: :func:`one_network_namespace`), as project ``name`` (default: its
    ``.env``'s; a second "host" on the same engine needs another)."""

    def __init__(
        self, directory: Path, program: list[str], uid: int, services: Services | None = None, name: str | None = None
    ) -> None:
        self.dir, self.program, self.uid = directory, program, uid
        env = dict(line.split("=", 1) for line in (directory / ".env").read_text().splitlines())
        self.name = name or env["COMPOSE_PROJECT_NAME"]
        override = {"services": services if services is not None else one_network_namespace(directory)}
        (directory / OVERRIDE).write_text(yaml.safe_dump(override, sort_keys=False))
        # the shell wins over .env
        self.env = {**os.environ, "FEDSIM_UID": str(uid), "FEDSIM_GID": str(uid), "COMPOSE_PROJECT_NAME": self.name}
        self.cmd = [*program, "-f", "compose.yaml", "-f", OVERRIDE]
        if uid != os.getuid():  # the project as that user would have written it
            for path in [directory, *directory.rglob("*")]:
                os.chown(path, uid, uid, follow_symlinks=False)

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh([*self.cmd, *args], timeout, check, cwd=self.dir, env=self.env)

    def container(self, service: str) -> str:
        """The service's container, running or exited (Compose v2's ``ps`` lists running ones only), not a
        one-off ``run``'s: found by the labels both Compose programs set."""
        labels = {"project": self.name, "service": service, "oneoff": "False"}
        filters = [f"label=com.docker.compose.{key}={value}" for key, value in labels.items()]
        (cid,) = docker("ps", "-aq", *(arg for f in filters for arg in ("--filter", f))).stdout.split()
        return cid

    def pid(self, service: str) -> int:
        """The host pid of the service's first process (its namespaces are the container's)."""
        return int(docker("inspect", "-f", "{{.State.Pid}}", self.container(service)).stdout)

    def wait(self, container: str, timeout: float) -> int:
        """The container's exit status, once it has exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", container).stdout.split()
            if state[0] in ("exited", "dead"):
                return int(state[1])
            time.sleep(2)
        raise AssertionError(f"{container} still running after {timeout:.0f} s:\n{self.logs()}")

    def logs(self, *services: str) -> str:
        return self("logs", "--no-color", *services, check=False).stdout[-6000:]

    def down(self) -> None:
        self("down", "--remove-orphans", "--timeout", "30", check=False)
        for leftover in self.leftovers()["containers"]:  # one-off `run` containers
            docker("rm", "-f", leftover, check=False)

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.name}"
        return {
            "containers": docker("ps", "-aq", "--filter", label).stdout.split(),
            "networks": docker("network", "ls", "-q", "--filter", label).stdout.split(),
        }

    def foreign_files(self) -> list[str]:
        """Files in the project that the host user does not own (what a container left as root)."""
        return [str(p) for p in [self.dir, *self.dir.rglob("*")] if p.lstat().st_uid != self.uid]


def prepare_all() -> None:
    """What the container test builds or fetches before its first project, cached for it: Debian's tools, the
    base image, the wheelhouse, fedsim's image (its layers in the engine's cache) and Compose v2."""
    with docker_engine():
        build_image(base_image(), wheelhouse())
    fetch_compose_v2()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the engine it started stops too
    try:
        prepare_all()
    except Unavailable as why:
        sys.exit(f"the container test's image could not be prepared: {why}")
