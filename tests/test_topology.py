"""One description of a deployment (fedsim/deploy/topology.py): the SuperLink's and each SuperNode's command, the
node config each is told (read back with Flower's own parser), the flwr CLI's connection, the app and run config
it submits, and the SuperLink's address as processes on this host reach it. The same Topology as compose services:
tests/test_compose.py; run as processes: tests/test_deploy.py."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.deploy.topology import (
    TlsFiles,
    Topology,
    app_pyproject,
    local_topology,
    run_config_toml,
    write_app,
)
from tests.conftest import small_config

PLAIN = Topology(
    num_nodes=3, superlink_bind="0.0.0.0", superlink_port=9093, superlink_host="10.0.0.5", node_ports=(9100, 9101, 9102)
)
TLS = TlsFiles(ca="/certs/ca.pem", cert="/certs/superlink.pem", key="/certs/superlink.key")
SECURE = replace(PLAIN, tls=TLS, node_keys=("/keys/n0.key", "/keys/n1.key", "/keys/n2.key"))


def test_the_superlink_listens_where_told_insecure_unless_given_tls() -> None:
    common = ["flower-superlink", "--host", "0.0.0.0", "--port", "9093", "--isolation", "subprocess",
              "--disable-runtime-dependency-installation"]  # fmt: skip
    assert PLAIN.superlink_command() == [*common, "--insecure"]
    assert replace(PLAIN, tls=TLS).superlink_command() == [
        *common, "--ssl-ca-certfile", "/certs/ca.pem", "--ssl-certfile", "/certs/superlink.pem",
        "--ssl-keyfile", "/certs/superlink.key",
    ]  # fmt: skip
    assert SECURE.superlink_command() == [*replace(PLAIN, tls=TLS).superlink_command(), "--enable-supernode-auth"]


def test_each_supernode_reaches_the_superlink_with_its_own_partition_port_and_key() -> None:
    for pid in range(3):
        common = ["fedsim-supernode", "--superlink", "10.0.0.5:9093",
                  "--node-config", f"partition-id={pid} num-partitions=3",
                  "--host", "127.0.0.1", "--port", str(9100 + pid)]  # fmt: skip
        assert PLAIN.supernode_command(pid) == [*common, "--insecure"]
        assert SECURE.supernode_command(pid) == [
            *common, "--root-certificates", "/certs/ca.pem", "--auth-supernode-private-key", f"/keys/n{pid}.key",
        ]  # fmt: skip


@pytest.mark.parametrize("state_dir", [None, "/state", "/srv/fedsim state/node 1"])
def test_flower_reads_back_each_nodes_partition_and_state_dir(state_dir: str | None) -> None:
    topo = replace(PLAIN, state_dir=state_dir)
    for pid in range(3):
        # as a SuperNode reads --node-config: the state dir quoted, so a path with spaces stays one value
        extra = {} if state_dir is None else {"state-dir": state_dir}
        assert parse_config_args([topo.node_config(pid)]) == {"partition-id": pid, "num-partitions": 3, **extra}


def test_the_flwr_cli_connects_as_the_supernodes_do() -> None:
    assert tomllib.loads(PLAIN.connection_toml()) == {
        "superlink": {"default": "fedsim", "fedsim": {"address": "10.0.0.5:9093", "insecure": True}}
    }
    assert tomllib.loads(SECURE.connection_toml()) == {
        "superlink": {"default": "fedsim", "fedsim": {"address": "10.0.0.5:9093", "root-certificates": "/certs/ca.pem"}}
    }


@pytest.mark.parametrize(
    ("address", "reached_at", "superlink_address"),
    [
        ("127.0.0.1", "127.0.0.1", "127.0.0.1:7000"),
        ("0.0.0.0", "127.0.0.1", "127.0.0.1:7000"),  # every interface: reached on loopback here
        ("::", "::1", "[::1]:7000"),
        ("::1", "::1", "[::1]:7000"),
        ("10.0.0.5", "10.0.0.5", "10.0.0.5:7000"),
    ],
)
def test_on_this_host_the_superlink_binds_the_deploy_address(
    tmp_path: Path, address: str, reached_at: str, superlink_address: str
) -> None:
    cfg = parse_config(small_config(tmp_path, deploy={"address": address}, train={"num_clients": 3}))
    topo = local_topology(cfg, 7000, [7001, 7002, 7003])
    assert topo == Topology(num_nodes=3, superlink_bind=address, superlink_port=7000, superlink_host=reached_at,
                            node_ports=(7001, 7002, 7003))  # fmt: skip
    assert topo.superlink_address == superlink_address
    assert topo.supernode_command(2)[topo.supernode_command(2).index("--superlink") + 1] == superlink_address


@pytest.mark.parametrize("resume", [False, True])
def test_what_the_flwr_cli_submits(tmp_path: Path, resume: bool) -> None:
    cfg = parse_config(small_config(tmp_path))
    write_app(tmp_path / "deploy", cfg, SECURE, resume)
    written = sorted(str(p.relative_to(tmp_path / "deploy")) for p in (tmp_path / "deploy").rglob("*") if p.is_file())
    assert written == ["app/pyproject.toml", "flwr/config.toml", "run-config.toml"]

    app = tomllib.loads((tmp_path / "deploy" / "app" / "pyproject.toml").read_text())
    assert app == tomllib.loads(app_pyproject())
    assert app["project"]["name"] == "fedsim-run" and app["tool"]["flwr"]["app"]["publisher"] == "fedsim"
    assert app["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "fedsim.deploy.serverapp:app", "clientapp": "fedsim.deploy.clientapp:app",
    }  # fmt: skip
    # the SuperLink refuses run-config keys the app does not name: it names exactly those submitted
    run_config = tomllib.loads((tmp_path / "deploy" / "run-config.toml").read_text())
    assert run_config == tomllib.loads(run_config_toml(cfg, resume))
    assert app["tool"]["flwr"]["app"]["config"] == {"fedsim-config": "", "fedsim-resume": False}
    assert run_config.keys() == app["tool"]["flwr"]["app"]["config"].keys()
    assert run_config["fedsim-resume"] is resume
    assert RunConfig.from_json(run_config["fedsim-config"]) == cfg  # the whole validated config

    assert (tmp_path / "deploy" / "flwr" / "config.toml").read_text() == SECURE.connection_toml()
