"""One description of a real Flower deployment: a SuperLink (which runs fedsim's ServerApp) and one
SuperNode per client (which runs fedsim's ClientApp), each told its partition through node config.

``fedsim deploy`` starts these commands as processes on this host; ``fedsim compose`` writes them
into a compose file as container commands. Both read them from :class:`Topology`, so what the
tests run is what the containers run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from fedsim import wire
from fedsim.config import RunConfig
from fedsim.files import write_file
from fedsim.names import host_port

CONNECTION = "fedsim"  # the flwr CLI's name for the SuperLink connection
SUPERNODE_RUNTIME_PORT = 9094  # Flower's default; on one host each SuperNode needs its own
# Flower's SuperExec (started by the SuperLink and by every SuperNode) looks for a task to start a
# ServerApp / ClientApp process for once a second by default: every Message waited 0.5 s for it on
# average. 0.1 s costs an idle SuperNode a few ms of CPU per second.
RUNTIME_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}


@dataclass(frozen=True)
class TlsFiles:
    """PEM paths as the processes see them (host paths, or mount points inside containers)."""

    ca: str
    cert: str
    key: str


@dataclass(frozen=True)
class Topology:
    num_nodes: int
    superlink_bind: str  # the only address the SuperLink listens on
    superlink_port: int
    superlink_host: str  # how SuperNodes and the flwr CLI reach it
    node_ports: tuple[int, ...]  # each SuperNode's Runtime API port (loopback only)
    tls: TlsFiles | None = None
    node_keys: tuple[str, ...] | None = None  # each SuperNode's private key, with supernode_auth
    state_dir: str | None = None  # where each SuperNode keeps its client state, if not in the run dir

    @property
    def superlink_address(self) -> str:
        return host_port(self.superlink_host, self.superlink_port)

    def superlink_command(self) -> list[str]:
        cmd = [
            "flower-superlink",
            "--host", self.superlink_bind,
            "--port", str(self.superlink_port),
            "--isolation", "subprocess",  # the SuperLink starts the ServerApp process itself
            "--disable-runtime-dependency-installation",  # fedsim is installed; nodes are offline
        ]  # fmt: skip
        cmd += self._server_tls()
        if self.node_keys is not None:
            cmd.append("--enable-supernode-auth")
        return cmd

    def _server_tls(self) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        return ["--ssl-ca-certfile", self.tls.ca, "--ssl-certfile", self.tls.cert, "--ssl-keyfile", self.tls.key]

    def node_config(self, partition_id: int) -> str:
        pairs: dict[str, object] = {wire.PARTITION_ID: partition_id, wire.NUM_PARTITIONS: self.num_nodes}
        if self.state_dir is not None:
            pairs[wire.STATE_DIR] = json.dumps(self.state_dir)
        return " ".join(f"{k}={v}" for k, v in pairs.items())

    def supernode_command(self, partition_id: int) -> list[str]:
        cmd = [
            "fedsim-supernode",  # flower-supernode with warm ClientApp processes (fedsim.deploy.supernode)
            "--superlink", self.superlink_address,
            "--node-config", self.node_config(partition_id),
            "--host", "127.0.0.1",  # its Runtime API serves only the ClientApp processes it starts
            "--port", str(self.node_ports[partition_id]),
        ]  # fmt: skip
        cmd += ["--root-certificates", self.tls.ca] if self.tls is not None else ["--insecure"]
        if self.node_keys is not None:
            cmd += ["--auth-supernode-private-key", self.node_keys[partition_id]]
        return cmd

    def connection_toml(self) -> str:
        """``$FLWR_HOME/config.toml`` for the flwr CLI that submits the run."""
        conn: dict[str, object] = {"address": self.superlink_address}
        if self.tls is None:
            conn["insecure"] = True
        else:
            conn["root-certificates"] = self.tls.ca
        return tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: conn}})


def local_topology(cfg: RunConfig, superlink_port: int, node_ports: list[int]) -> Topology:
    """Every process on this host: the SuperLink on ``deploy.address``, SuperNodes on loopback ports."""
    address = cfg.deploy.address
    return Topology(
        num_nodes=cfg.train.num_clients,
        superlink_bind=address,
        superlink_port=superlink_port,
        superlink_host={"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address),
        node_ports=tuple(node_ports),
    )


def app_pyproject() -> str:
    """A Flower App naming fedsim's installed apps: what ``flwr run`` bundles and submits."""
    return tomli_w.dumps({
        "project": {"name": "fedsim-run", "version": "1.0.0", "description": "a fedsim run", "license": "MIT"},
        "tool": {"flwr": {"app": {
            "publisher": "fedsim",
            "components": {"serverapp": "fedsim.deploy.serverapp:app", "clientapp": "fedsim.deploy.clientapp:app"},
            "config": {wire.RUN_CONFIG: "", wire.RESUME: False},  # the SuperLink refuses keys not named here
        }}},
    })  # fmt: skip


def run_config_toml(cfg: RunConfig, resume: bool = False) -> str:
    """``--run-config`` file carrying the whole validated config to the ServerApp; ``resume``: it goes on from
    the checkpoint in the config's run directory."""
    return tomli_w.dumps({wire.RUN_CONFIG: cfg.to_json(), wire.RESUME: resume})


def write_app(directory: Path, cfg: RunConfig, topology: Topology, resume: bool = False) -> None:
    """The files the flwr CLI needs in ``directory`` (a directory of fedsim's, :mod:`fedsim.files`): the app, the
    run config and the SuperLink connection."""
    write_file(directory / "app" / "pyproject.toml", app_pyproject().encode(), directory)
    write_file(directory / "run-config.toml", run_config_toml(cfg, resume).encode())
    write_file(directory / "flwr" / "config.toml", topology.connection_toml().encode(), directory)
