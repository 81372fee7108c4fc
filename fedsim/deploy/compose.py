"""``fedsim compose``: the deployment of :mod:`fedsim.deploy.topology` as a Docker Compose project.

Services: ``superlink`` (runs the ServerApp; holds the run directory), ``supernode-<i>`` for every
partition (its partition id in node config, the data read-only, CPU / memory / GPU limits), with
SuperNode auth ``register`` (adds the SuperNodes' keys before they start) and ``submit`` (submits the
run and follows it, or resumes it from its checkpoint with ``docker compose run --rm submit --resume``:
:mod:`fedsim.deploy.submit`). Every container runs the same fedsim image
(``docker/Dockerfile``) as the host user who wrote the project (``.env``), so what they write to the
bind mounts (``runs/``, ``state/``) is that user's. The data (mounted from ``$FEDSIM_DATA``, default
the host directory holding ``data.root``, one Compose can name: :func:`check_mounts`; shipped ``fedsim:``
data is in the image) and the run
directory appear at the same paths in every container, so the config the ServerApp receives is
valid on every node. The file is one that Compose v2 and docker-compose 1.29 both accept.

``--out`` is a new or empty directory, or a project ``fedsim compose`` wrote (:mod:`fedsim.ownership`):
written again, for the config as it is now (a SuperNode no longer in it loses its ``state/`` directory).
Nothing is written before the config, the node count and the directory are known to be good.
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.data.generated import GeneratedLoader
from fedsim.deploy.keys import SECRET, make_node_keys, make_tls
from fedsim.deploy.topology import RUNTIME_ENV, SUPERNODE_RUNTIME_PORT, TlsFiles, Topology, write_app
from fedsim.engines.runner import OFFLINE_ENV, check_runnable
from fedsim.errors import ConfigError, FedsimError, WriteError
from fedsim.experiment.resolve import resolve
from fedsim.files import check_links, make_dirs, remove, write_file
from fedsim.names import check_host
from fedsim.ownership import MARKER, check_own, mark_own
from fedsim.paths import PACKAGE_PREFIX, package_path
from fedsim.reading import MIB, read_bytes

DEFAULT_PORT = 9093
DATA, RUNS, PROJECT, TLS, KEYS, STATE = "/data", "/runs", "/fedsim", "/certs", "/keys", "/state"  # in containers
IMAGE = "fedsim:latest"
PROJECT_KIND = "compose project"  # what fedsim's mark says a project directory is
# what fedsim compose writes in a project, whole; and the directories it makes for the containers' bind mounts
WRITTEN = (MARKER, "app", "run-config.toml", "flwr", "tls", "node-keys", ".env", "compose.yaml")
MOUNTS = ("runs", "state")
# One container per SuperNode, all on the project's network: a Linux bridge joins at most 1,024 (BR_MAX_PORTS,
# Docker's 1,023 containers per bridge network); every SuperNode's Runtime API port (9094 + its partition
# id) stays below 65,536 with room to spare. More clients than this: fedsim run.
MAX_NODES = 1000
# --node-memory: Docker's form (a number, then b, k, m or g: bytes, KiB, MiB, GiB), at most 1 TiB per SuperNode: one
# SuperNode trains one client, and a limit past the memory of any host it may run on limits nothing, while
# 99999999999999999999g overflowed the int64 byte count Docker reads it into (a file Compose refuses at `up`)
_MEMORY = re.compile(r"([1-9][0-9]*(?:\.[0-9]+)?)([bkmg]?)", re.IGNORECASE)
MAX_NODE_MEMORY = 1024**4
# a SuperNode's warm ClientApp process alone holds torch, Flower and fedsim (about 750 MB resident before any
# data or model): a smaller limit gets the node killed on its first Message (Docker itself refuses under 6 MB)
MIN_NODE_MEMORY = 1024**3


def compose_topology(cfg: RunConfig, superlink_host: str) -> Topology:
    """The containers' view: SuperNodes reach the SuperLink by service name (or a host name across
    hosts). Each SuperNode's Runtime API gets a port of its own on loopback (Flower's default + its
    partition id): harmless in containers of their own, and what lets the services share one network
    namespace (``network_mode: host`` on one machine, or the container test's override)."""
    n = cfg.train.num_clients
    topo = Topology(
        num_nodes=n,
        superlink_bind="0.0.0.0",  # inside its container; the host publishes it on deploy.address only
        superlink_port=cfg.deploy.port or DEFAULT_PORT,
        superlink_host=superlink_host,
        node_ports=tuple(SUPERNODE_RUNTIME_PORT + pid for pid in range(n)),
        state_dir=STATE,  # client state (checkpoints) stays on the SuperNode's host, not in the run dir
    )
    if cfg.deploy.tls:
        topo = replace(topo, tls=TlsFiles(f"{TLS}/ca.pem", f"{TLS}/superlink.pem", f"{TLS}/superlink.key"))
    if cfg.deploy.supernode_auth:
        topo = replace(topo, node_keys=tuple(f"{KEYS}/supernode-{i}.key" for i in range(n)))
    return topo


def container_config(cfg: RunConfig) -> RunConfig:
    """The run config as the containers see it: data under /data, the run directory under /runs."""
    if not cfg.data.root:
        raise ConfigError("data.root: fedsim compose mounts the dataset into the containers; give its path")
    inside = cfg.model_copy(deep=True)
    if not cfg.data.root.startswith(PACKAGE_PREFIX):  # shipped data is inside the image already
        inside.data.root = f"{DATA}/{Path(cfg.data.root).name}"
    inside.output.dir = RUNS
    inside.output.run_dir = f"{RUNS}/{cfg.name}"
    return inside


class Interpolated(str):
    """A compose.yaml value whose ``${VAR}`` fedsim means Compose to interpolate; :func:`escape_dollars` escapes
    every other value's ``$``."""


USER = Interpolated("${FEDSIM_UID:-49999}:${FEDSIM_GID:-49999}")  # .env gives the uid / gid of who ran fedsim compose


def escape_dollars(value: Any) -> Any:
    """``value`` with ``$`` written ``$$`` in every text but an :class:`Interpolated` one: Compose interpolates
    ``$`` everywhere in the file, so a run name ``x${HOME}`` would have become the host's home (and ``a${`` a
    Compose error)."""
    if isinstance(value, Interpolated):
        return str(value)
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {escape_dollars(k): escape_dollars(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_dollars(v) for v in value]
    return value


def _service(command: list[str], volumes: list[str], **extra: Any) -> dict[str, Any]:
    """A service of the fedsim image, run as the host user: what it writes to bind mounts is theirs."""
    env = dict(OFFLINE_ENV)
    return {"image": IMAGE, "user": USER, "command": command, "environment": env, "volumes": volumes, **extra}


def check_node_memory(memory: str) -> str:
    """``memory`` if it is Docker's memory form from :data:`MIN_NODE_MEMORY` to :data:`MAX_NODE_MEMORY`,
    else a ConfigError."""
    match = _MEMORY.fullmatch(memory)
    if match is None:
        raise ConfigError(f"--node-memory {memory!r}: give Docker's memory form, e.g. 4g, 1536m")
    number, unit = match.groups()
    size = float(number) * 1024 ** "bkmg".index(unit.lower() or "b")
    if not MIN_NODE_MEMORY <= size <= MAX_NODE_MEMORY:
        raise ConfigError(
            f"--node-memory {memory!r}: from 1g (a SuperNode's warm ClientApp process alone holds torch, Flower "
            "and fedsim, about 750 MB) to 1024g (1 TiB) per SuperNode, e.g. 4g, 1536m"
        )
    return memory


def node_resources(cfg: RunConfig, node_memory: str | None) -> dict[str, Any]:
    """A SuperNode's limits: its client's CPUs (and memory); GPUs as whole devices, since compose
    cannot split one (fractions apply within a Ray pool, not here)."""
    limits: dict[str, Any] = {"cpus": str(cfg.simulation.client_resources.num_cpus)}
    if node_memory:
        limits["memory"] = node_memory
    resources: dict[str, Any] = {"limits": limits}
    gpus = cfg.simulation.client_resources.num_gpus
    if gpus > 0:
        gpu = {"driver": "nvidia", "count": math.ceil(gpus), "capabilities": ["gpu"]}
        resources["reservations"] = {"devices": [gpu]}
    return resources


def check_mounts(cfg: RunConfig, out: Path) -> None:
    """The host directories compose.yaml mounts are ones Compose v2 and docker-compose 1.29 both read back as
    written, else a ConfigError. The data's, in ``${FEDSIM_DATA:-<it>}:/data:ro``: ``}`` ends the default,
    ``:`` splits the volume, and no spelling of ``$`` is one ``$`` to both inside a default (v2 interpolates a
    default, where ``$`` is written ``$$``; 1.29 takes it as written, ``$$`` too); spaces, quotes, ``{``,
    ``#`` or a newline are read as written (``docker-compose config``; compose-go's template code). The
    project's own (``./runs``, ``./state``, ``./tls``): 1.29 makes them absolute, then splits them at ``:``."""
    mounted = {"--out": (str(out.resolve()), ":", "write the project to a directory")}
    if not (root := cfg.data.root or "").startswith(PACKAGE_PREFIX):  # shipped data is in the image
        mounted["data.root"] = (str(Path(root).parent), "$}:", "move or link the data to a directory")
    for option, (path, special, instead) in mounted.items():
        if bad := sorted(set(path) & set(special)):
            raise ConfigError(
                f"{option}: Compose cannot mount {path!r}, a path holding {' and '.join(map(repr, bad))}; {instead} "
                f"whose path has no {' or '.join(special)}"
            )


def compose_project(cfg: RunConfig, topo: Topology, node_memory: str | None = None) -> dict[str, Any]:
    root = cfg.data.root or ""
    parent = Path(root).parent  # a path check_mounts let through: Compose reads it back as written
    data = [] if root.startswith(PACKAGE_PREFIX) else [Interpolated(f"${{FEDSIM_DATA:-{parent}}}:{DATA}:ro")]
    certs = [f"./tls:{TLS}:ro"] if topo.tls is not None else []
    keys = [f"./node-keys:{KEYS}:ro"] if topo.node_keys is not None else []
    port = topo.superlink_port
    # decoded data, kept across runs and ClientApp processes; SuperExec's quicker look for tasks
    runtime = {"FEDSIM_CACHE": f"{STATE}/cache", **RUNTIME_ENV}
    services: dict[str, Any] = {
        "superlink": _service(
            topo.superlink_command(), [*data, f"./runs:{RUNS}", *certs, f"./state/superlink:{STATE}"],
            ports=[f"{cfg.deploy.address}:{port}:{port}"],
        ),
    }  # fmt: skip
    services["superlink"]["environment"].update(runtime)
    cli = [f".:{PROJECT}", *certs, *keys]  # the flwr CLI's config (FLWR_HOME) and the app bundle
    wait = ["python", "-m", "fedsim.deploy.submit", "--timeout", f"{cfg.deploy.startup_timeout_s:g}"]
    node_deps: dict[str, Any] = {"superlink": {"condition": "service_started"}}
    if topo.node_keys is not None:  # SuperNodes start once their keys are registered, not before
        public = [f"{KEYS}/supernode-{pid}.pub" for pid in range(topo.num_nodes)]
        services["register"] = _service([*wait, "register", *public], cli, depends_on=["superlink"], restart="no")
        node_deps["register"] = {"condition": "service_completed_successfully"}
    for pid in range(topo.num_nodes):
        services[f"supernode-{pid}"] = _service(
            topo.supernode_command(pid), [*data, *certs, *keys, f"./state/supernode-{pid}:{STATE}"],
            depends_on=copy.deepcopy(node_deps), deploy={"resources": node_resources(cfg, node_memory)},
            restart="on-failure",
        )  # fmt: skip
        services[f"supernode-{pid}"]["environment"].update(runtime)
    run = ["run", "--app", f"{PROJECT}/app", "--run-config", f"{PROJECT}/run-config.toml",
           "--run-dir", f"{PROJECT}/runs/{cfg.name}", "--rounds", str(cfg.train.rounds)]  # fmt: skip
    # an entrypoint, not a command: `docker compose run --rm submit --resume` appends the flag to it, where
    # arguments given to `run` would replace a command whole
    submit = _service([*wait, *run], cli, depends_on=["superlink"], restart="no")
    services["submit"] = {"entrypoint" if key == "command" else key: value for key, value in submit.items()}
    for name in ("register", "submit"):
        if name in services:
            services[name]["environment"]["FLWR_HOME"] = f"{PROJECT}/flwr"
    return {"services": services}


def check_against_data_here(cfg: RunConfig) -> None:
    """The plugins and their options, as ``fedsim run`` checks them before anything is written; and, where the
    data is on this host (generated, shipped in fedsim, or at ``data.root``), the config against the data, the
    model and the strategy as ``fedsim run`` checks it (a normaliser or a strategy that does not fit the model, a
    batch larger than the data), less the device, which is the nodes'. Data that is elsewhere (``$FEDSIM_DATA``
    on the nodes' host) is checked by the ServerApp as the run starts."""
    experiment = resolve(cfg)
    root = cfg.data.root
    if isinstance(experiment.loader, GeneratedLoader) or (root is not None and package_path(root).exists()):
        check_runnable(experiment, "deploy")


def project_name(cfg: RunConfig) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", f"fedsim-{cfg.name}".lower())


def env_file(cfg: RunConfig) -> str:
    """``.env``: the project's name and the user the services run as (Compose v2 and docker-compose 1.29
    read it; a variable set in the shell wins)."""
    return f"COMPOSE_PROJECT_NAME={project_name(cfg)}\nFEDSIM_UID={os.getuid()}\nFEDSIM_GID={os.getgid()}\n"


def write_compose(
    cfg: RunConfig, out: Path, nodes: int | None = None, superlink_host: str = "superlink",
    node_memory: str | None = None, tls_hosts: list[str] | None = None,
) -> Path:  # fmt: skip
    """Write ``compose.yaml`` and the files its services mount into ``out``; returns the compose file."""
    check_host(superlink_host, "--superlink-host")
    if node_memory is not None:
        check_node_memory(node_memory)
    for host in tls_hosts or []:
        check_host(host, "--tls-host")
    if nodes is not None:  # validated as if the config said so
        raw = cfg.model_dump(mode="json")
        raw["train"]["num_clients"] = nodes
        try:
            cfg = parse_config(raw)
        except ConfigError as err:
            raise ConfigError(f"--nodes {nodes}: {err}") from err
    n = cfg.train.num_clients
    if n > MAX_NODES:
        raise ConfigError(
            f"{'--nodes' if nodes is not None else 'train.num_clients ='} {n}: fedsim compose writes one SuperNode "
            f"container per client, at most {MAX_NODES:,} (one Docker network); run more clients with fedsim run"
        )
    check_against_data_here(cfg)
    check_mounts(cfg, out)
    topo = compose_topology(cfg, superlink_host)
    check_own(out, PROJECT_KIND, "--out")
    check_links(out, WRITTEN)  # a link where the project's files go: refused before any is written
    check_links(out, MOUNTS, deep=False)  # what is in them is the containers'
    check_links(out / "state", deep=False)
    try:
        return _write_project(cfg, out, topo, superlink_host, node_memory, tls_hosts or [])
    except (OSError, WriteError) as err:  # a full disk, a directory made read-only meanwhile
        path = err.path if isinstance(err, WriteError) else err.filename or out
        raise FedsimError(
            f"--out {out}: cannot write {path} ({err.strerror}); the project is incomplete: run fedsim compose "
            "again once it can be written"
        ) from err


def _write_project(
    cfg: RunConfig, out: Path, topo: Topology, superlink_host: str, node_memory: str | None, tls_hosts: list[str]
) -> Path:
    n = cfg.train.num_clients
    out.mkdir(parents=True, exist_ok=True)
    mark_own(out, PROJECT_KIND)
    write_app(out, container_config(cfg), topo)
    given = cfg.deploy.certificates
    if given is not None:  # the user's own PEM files, under the names the services expect
        for field, pem, name in (("ca", given.ca, "ca.pem"), ("cert", given.cert, "superlink.pem")):
            write_file(out / "tls" / name, read_bytes(pem, f"deploy.certificates.{field}", MIB), out)
        key = read_bytes(given.key, "deploy.certificates.key", MIB)
        write_file(out / "tls" / "superlink.key", key, mode=SECRET)  # owner-only, as the original
    elif cfg.deploy.tls:  # made afresh: the names and the node count may have changed
        # 127.0.0.1: the SuperLink's own SuperExec reaches it there, whatever deploy.address is (0.0.0.0 across hosts)
        names = [superlink_host, "superlink", "localhost", "127.0.0.1", cfg.deploy.address, *tls_hosts]
        make_tls(out / "tls", names)
    if cfg.deploy.supernode_auth:
        remove(out / "node-keys")
        make_node_keys(out / "node-keys", cfg.train.num_clients)
    # made here, by the host user: a directory the engine had to make for a bind mount would be root's
    nodes_state = {f"supernode-{pid}" for pid in range(n)}
    for mount in ("runs", "state/superlink", *(f"state/{name}" for name in sorted(nodes_state))):
        make_dirs(out / mount, out)
    for stale in (out / "state").glob("supernode-*"):  # of a SuperNode this project no longer has
        if stale.is_dir() and stale.name not in nodes_state:
            remove(stale)
    write_file(out / ".env", env_file(cfg).encode())
    path = out / "compose.yaml"
    header = (
        f"# Generated by `fedsim compose` for {cfg.train.num_clients} SuperNodes; see docs/deployment.md.\n"
        "#   docker compose up -d && docker compose logs -f submit     (Compose v2; docker-compose 1.29 alike)\n"
        "#   the fedsim:latest image: docker build -f docker/Dockerfile -t fedsim:latest .\n"
    )
    project = escape_dollars(compose_project(cfg, topo, node_memory))
    write_file(path, (header + yaml.safe_dump(project, sort_keys=False, width=120)).encode())
    return path
