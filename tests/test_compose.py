"""``fedsim compose``: the Docker Compose project, checked structurally (no Docker engine runs here),
and made from the same Topology as ``fedsim deploy``'s processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fedsim.app.cli import main
from fedsim.config_file import load_config
from fedsim.deploy.compose import compose_topology
from fedsim.errors import ConfigError
from tests.conftest import CIFAR_Q75, MNIST_SMALL, REPO, disk_full_at, one_line

QUICKSTART = REPO / "configs" / "quickstart.yaml"
CIFAR = REPO / "configs" / "cifar10_1class_fedavg.yaml"


def compose(config: Path, out: Path, *args: str) -> dict:
    """``fedsim compose`` through the CLI's own entry point (in process: it only writes files)."""
    assert main(["compose", str(config), "--out", str(out), *args]) == 0
    return yaml.safe_load((out / "compose.yaml").read_text())


def node_config(command: list[str]) -> dict[str, str]:
    pairs = command[command.index("--node-config") + 1].split()
    return dict(p.split("=", 1) for p in pairs)


@pytest.mark.parametrize("nodes", [3, 10, 25])
def test_one_service_per_supernode_with_complete_unique_partition_ids(tmp_path: Path, nodes: int) -> None:
    project = compose(QUICKSTART, tmp_path, "--nodes", str(nodes))
    services = project["services"]
    assert set(services) == {"superlink", "submit"} | {f"supernode-{i}" for i in range(nodes)}

    cfg = load_config(QUICKSTART, [f"train.num_clients={nodes}"])
    topo = compose_topology(cfg, "superlink")
    assert services["superlink"]["command"] == topo.superlink_command()
    assert services["superlink"]["ports"] == ["127.0.0.1:9093:9093"]  # published on deploy.address only
    ids = []
    for i in range(nodes):
        node = services[f"supernode-{i}"]
        assert node["command"] == topo.supernode_command(i)
        assert node["command"][node["command"].index("--superlink") + 1] == "superlink:9093"
        conf = node_config(node["command"])
        ids.append(int(conf["partition-id"]))
        assert conf["num-partitions"] == str(nodes)
        assert "ports" not in node  # nothing of a SuperNode is reachable from outside its container
        assert node["depends_on"] == {"superlink": {"condition": "service_started"}}  # no keys to wait for
        assert node["user"] == "${FEDSIM_UID:-49999}:${FEDSIM_GID:-49999}"
        assert node["environment"]["FEDSIM_CACHE"] == "/state/cache"  # decoded data kept on the node
        assert node["environment"]["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1"  # as under fedsim deploy
        assert node["deploy"]["resources"]["limits"] == {"cpus": "1.0"}
        # the quickstart's data ships inside the image (fedsim:); client state stays on the node's host
        assert node["volumes"] == [f"./state/supernode-{i}:/state"]
        assert conf["state-dir"] == '"/state"'
    assert sorted(ids) == list(range(nodes)) and len(set(ids)) == nodes

    submit = services["submit"]
    # an entrypoint: `docker compose run --rm submit --resume` appends to it (tests/test_containers.py runs that)
    assert "command" not in submit and submit["entrypoint"] == [
        "python", "-m", "fedsim.deploy.submit", "--timeout", "120", "run", "--app", "/fedsim/app",
        "--run-config", "/fedsim/run-config.toml", "--run-dir", "/fedsim/runs/quickstart", "--rounds", "10",
    ]  # fmt: skip
    assert submit["environment"]["FLWR_HOME"] == "/fedsim/flwr"
    assert tomllib.loads((tmp_path / "flwr" / "config.toml").read_text())["superlink"]["fedsim"] == {
        "address": "superlink:9093", "insecure": True,
    }  # fmt: skip
    run_cfg = json.loads(tomllib.loads((tmp_path / "run-config.toml").read_text())["fedsim-config"])
    assert run_cfg["train"]["num_clients"] == nodes
    assert run_cfg["data"]["root"] == "fedsim:assets/mnist_small.npz"
    assert run_cfg["output"]["run_dir"] == "/runs/quickstart"
    for service in services.values():
        assert service["image"] == "fedsim:latest"
        assert service["environment"]["FLWR_TELEMETRY_ENABLED"] == "0"


def test_data_volume_and_container_paths(tmp_path: Path) -> None:
    services = compose(CIFAR, tmp_path, "--nodes", "4", "--node-memory", "3g")["services"]
    data = f"${{FEDSIM_DATA:-{CIFAR_Q75.resolve().parent}}}:/data:ro"
    for name in ["superlink"] + [f"supernode-{i}" for i in range(4)]:
        assert data in services[name]["volumes"], name
    assert "./runs:/runs" in services["superlink"]["volumes"]
    assert services["supernode-0"]["deploy"]["resources"]["limits"] == {"cpus": "1.0", "memory": "3g"}
    run_cfg = json.loads(tomllib.loads((tmp_path / "run-config.toml").read_text())["fedsim-config"])
    assert run_cfg["data"]["root"] == "/data/cifar10_jpg_q75.tar.gz"


def test_tls_auth_and_gpus(tmp_path: Path) -> None:
    project = compose(
        QUICKSTART, tmp_path, "--nodes", "3", "--superlink-host", "server.example.org",
        "--set", "deploy.tls=true", "deploy.supernode_auth=true", "simulation.client_resources.num_gpus=0.5",
    )  # fmt: skip
    services = project["services"]
    link = services["superlink"]["command"]
    assert "--insecure" not in link and "--enable-supernode-auth" in link
    assert link[link.index("--ssl-certfile") + 1] == "/certs/superlink.pem"
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((tmp_path / "tls" / "superlink.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"server.example.org", "superlink", "localhost"} <= set(names.get_values_for_type(x509.DNSName))
    for i in range(3):
        node = services[f"supernode-{i}"]
        cmd = node["command"]
        assert "--insecure" not in cmd
        assert cmd[cmd.index("--root-certificates") + 1] == "/certs/ca.pem"
        assert cmd[cmd.index("--auth-supernode-private-key") + 1] == f"/keys/supernode-{i}.key"
        assert cmd[cmd.index("--superlink") + 1] == "server.example.org:9093"
        assert (tmp_path / "node-keys" / f"supernode-{i}.pub").is_file()
        assert node["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 1
        assert f"/keys/supernode-{i}.pub" in services["register"]["command"]
    conn = tomllib.loads((tmp_path / "flwr" / "config.toml").read_text())["superlink"]["fedsim"]
    assert conn == {"address": "server.example.org:9093", "root-certificates": "/certs/ca.pem"}


def _shape(cmd: list[str]) -> list[str]:
    """A command without its values: the program and its flags, in order."""
    return [cmd[0]] + [a for a in cmd[1:] if a.startswith("--")]


@pytest.mark.parametrize("secure", [False, True])
def test_the_containers_and_fedsim_deploy_run_the_same_commands(tmp_path: Path, secure: bool) -> None:
    from fedsim.deploy.launcher import LocalDeployment

    flags = [f"deploy.tls={secure}", f"deploy.supernode_auth={secure}", f"output.run_dir={tmp_path / 'run'}"]
    cfg = load_config(QUICKSTART, flags)
    local = LocalDeployment(cfg).topology  # what fedsim deploy starts (no process started here)
    in_containers = compose_topology(cfg, "superlink")
    assert _shape(local.superlink_command()) == _shape(in_containers.superlink_command())
    for i in range(cfg.train.num_clients):
        loc, con = local.supernode_command(i), in_containers.supernode_command(i)
        assert _shape(loc) == _shape(con)
        assert node_config(loc) | {"state-dir": '"/state"'} == node_config(con)  # same partition, same count
    assert replace(in_containers, superlink_bind=local.superlink_bind, superlink_port=local.superlink_port,
                   superlink_host=local.superlink_host, node_ports=local.node_ports, tls=local.tls,
                   node_keys=local.node_keys, state_dir=None) == local  # fmt: skip


def test_superexec_looks_for_tasks_every_tenth_of_a_second_in_processes_and_containers(tmp_path: Path) -> None:
    """Flower's default (1 s) made every Message wait 0.5 s on average before its ClientApp started."""
    from fedsim.deploy.launcher import LocalDeployment

    cfg = load_config(QUICKSTART, [f"output.run_dir={tmp_path / 'run'}"])
    assert LocalDeployment(cfg)._env("supernode-0")["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1"
    services = compose(QUICKSTART, tmp_path / "p", "--nodes", "2")["services"]
    for name in ("superlink", "supernode-0", "supernode-1"):
        assert services[name]["environment"]["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1", name


def test_committed_example_is_what_fedsim_compose_writes(tmp_path: Path) -> None:
    example = REPO / "docker" / "quickstart"
    compose(QUICKSTART, tmp_path)
    for name in ("compose.yaml", "run-config.toml", "app/pyproject.toml", "flwr/config.toml"):
        assert (example / name).read_text() == (tmp_path / name).read_text(), name


def test_app_bundle_names_the_apps_the_repository_declares() -> None:
    repo = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    bundle = tomllib.loads(Path(REPO / "docker" / "quickstart" / "app" / "pyproject.toml").read_text())
    assert bundle["tool"]["flwr"]["app"]["components"] == repo["components"]


def test_dockerfile_builds_on_flower_from_pypi_or_from_a_wheelhouse() -> None:
    text = (REPO / "docker" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=flwr/base:\$\{FLWR_VERSION\}", text, re.M)  # a build argument
    assert re.search(r"^ARG FLWR_VERSION=1\.41\.0$", text, re.M)  # the version pyproject pins
    assert "flwr[simulation]==1.41.0" in (REPO / "pyproject.toml").read_text()
    assert re.search(r"^ARG TORCH_INDEX=$", text, re.M)  # PyPI unless another index is given
    for path in ("fedsim", "strategies", "partitions", "configs", "pyproject.toml"):
        assert re.search(rf"^COPY {re.escape(path)} ", text, re.M), path
        assert (REPO / path).exists()
    assert "pip install --no-cache-dir --no-index --no-deps --no-build-isolation /tmp/fedsim" in text
    # with wheels in docker/wheels, nothing comes from an index (the container test builds it that way)
    assert "COPY docker/wheels/ " in text and "--no-index" in text
    assert (REPO / "docker" / "wheels").is_dir()  # COPY needs it in every checkout
    assert "docker/wheels" not in (REPO / ".dockerignore").read_text()


def test_the_image_does_not_run_as_root() -> None:
    text = (REPO / "docker" / "Dockerfile").read_text()
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users[-1] not in ("root", "0"), users


def test_services_run_as_the_user_who_wrote_the_project_in_directories_that_user_owns(tmp_path: Path) -> None:
    """Directories the engine makes for bind mounts are root's; fedsim compose makes them itself."""
    import os

    project = compose(QUICKSTART, tmp_path / "p", "--nodes", "3")
    env = dict(line.split("=", 1) for line in (tmp_path / "p" / ".env").read_text().splitlines())
    assert env == {"COMPOSE_PROJECT_NAME": "fedsim-quickstart", "FEDSIM_UID": str(os.getuid()),
                   "FEDSIM_GID": str(os.getgid())}  # fmt: skip
    for name, service in project["services"].items():
        assert service["user"] == "${FEDSIM_UID:-49999}:${FEDSIM_GID:-49999}", name
        for volume in service["volumes"]:
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (tmp_path / "p" / host).is_dir(), volume
    for name in ("runs", "state/superlink", "state/supernode-0", "state/supernode-2"):
        assert (tmp_path / "p" / name).stat().st_uid == os.getuid()


def test_supernode_auth_without_tls_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Flower's SuperLink refuses to start (exit 104) and the SuperNodes exit 303: refuse it up front."""
    assert main(["compose", str(QUICKSTART), "--out", str(tmp_path / "p"), "--set", "deploy.supernode_auth=true"]) == 2
    err = capsys.readouterr().err
    assert "deploy.supernode_auth" in err and "deploy.tls" in err and "Traceback" not in err  # wording: the corpus
    assert not (tmp_path / "p").exists()
    assert main(["deploy", str(REPO / "configs" / "deploy_smoke.yaml"), "--set", "deploy.supernode_auth=true"]) == 2
    assert capsys.readouterr().err.startswith("fedsim: error: ")


def test_supernodes_start_after_their_keys_are_registered_and_submit_registers_nothing(tmp_path: Path) -> None:
    services = compose(QUICKSTART, tmp_path, "--nodes", "3", "--set", "deploy.tls=true", "deploy.supernode_auth=true")[
        "services"
    ]
    register = services["register"]
    assert register["command"][:5] == ["python", "-m", "fedsim.deploy.submit", "--timeout", "120"]
    assert register["command"][5:] == ["register", *(f"/keys/supernode-{i}.pub" for i in range(3))]
    assert register["restart"] == "no" and register["environment"]["FLWR_HOME"] == "/fedsim/flwr"
    for i in range(3):
        assert services[f"supernode-{i}"]["depends_on"] == {
            "superlink": {"condition": "service_started"},
            "register": {"condition": "service_completed_successfully"},
        }
    assert "register" not in services["submit"]["entrypoint"]  # a second `run submit` submits again, nothing else


def test_the_certificate_names_loopback_whatever_the_superlinks_address(tmp_path: Path) -> None:
    """The SuperLink's own SuperExec connects to it on 127.0.0.1: across hosts (deploy.address 0.0.0.0, as
    docs/deployment.md's recipe says) a certificate without it failed that handshake and no ServerApp started."""
    import ipaddress

    from cryptography import x509

    compose(QUICKSTART, tmp_path, "--superlink-host", "server.example.org",
            "--set", "deploy.tls=true", "deploy.address=0.0.0.0")  # fmt: skip
    cert = x509.load_pem_x509_certificate((tmp_path / "tls" / "superlink.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "server.example.org" in names.get_values_for_type(x509.DNSName)


def test_no_service_runs_a_shell(tmp_path: Path) -> None:
    """A shell as PID 1 ignores SIGTERM: the container would take 10 s to stop and end with 137."""
    services = compose(QUICKSTART, tmp_path, "--nodes", "2", "--set", "deploy.tls=true", "deploy.supernode_auth=true")[
        "services"
    ]
    for name, service in services.items():
        program = service.get("command", service.get("entrypoint"))[0]
        assert program in ("flower-superlink", "fedsim-supernode", "python"), name


def test_compose_file_is_one_docker_compose_1_29_accepts(tmp_path: Path) -> None:
    """Debian 12's docker-compose 1.29 rejects a top-level ``name``; the project's name is in ``.env``."""
    project = compose(QUICKSTART, tmp_path, "--nodes", "3", "--set", "deploy.tls=true", "deploy.supernode_auth=true")
    assert set(project) == {"services"}
    checked, failed = 0, []
    for program in (["docker-compose"], ["docker", "compose"]):
        if shutil.which(program[0]) is None:
            continue
        version = subprocess.run([*program, "version"], capture_output=True, text=True)
        if version.returncode != 0:
            failed.append(f"{' '.join(program)} version: {version.stderr.strip()[-300:]}")
            continue
        res = subprocess.run([*program, "config", "-q"], cwd=tmp_path, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(program)}: {res.stderr}"
        checked += 1
    if not checked:
        pytest.skip(f"no docker-compose or docker compose here (the container test runs them) {failed}")


def test_given_certificates_are_used_by_processes_and_containers(tmp_path: Path) -> None:
    from fedsim.deploy.keys import make_tls
    from fedsim.deploy.launcher import LocalDeployment

    tls = make_tls(tmp_path / "mine", ["127.0.0.1"])
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(
        (REPO / "configs" / "deploy_smoke.yaml").read_text()
        + "deploy: {tls: true, certificates: {ca: mine/ca.pem, cert: mine/superlink.pem, key: mine/superlink.key}}\n"
    )
    cfg = load_config(cfg_path)  # relative to the config file
    assert cfg.deploy.certificates is not None and cfg.deploy.certificates.ca == tls.ca
    cfg.output.run_dir = str(tmp_path / "run")
    link = LocalDeployment(cfg).topology.superlink_command()
    assert link[link.index("--ssl-certfile") + 1] == tls.cert and not (tmp_path / "run" / "deploy" / "tls").exists()
    compose(cfg_path, tmp_path / "project")
    assert (tmp_path / "project" / "tls" / "ca.pem").read_bytes() == Path(tls.ca).read_bytes()
    # the private key stays the owner's alone, as the user's own file is
    key = tmp_path / "project" / "tls" / "superlink.key"
    assert key.read_bytes() == Path(tls.key).read_bytes()
    assert Path(tls.key).stat().st_mode & 0o777 == 0o600 and key.stat().st_mode & 0o777 == 0o600


def test_certificates_without_tls_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(
        (REPO / "configs" / "deploy_smoke.yaml").read_text() + "deploy: {certificates: {ca: a, cert: b, key: c}}\n"
    )
    with pytest.raises(ConfigError, match=r"deploy\.certificates\b.*deploy\.tls\b"):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [("deploy.address=myhost", "deploy.address = 'myhost'"),
     ("deploy.port=70000", "deploy.port"),
     ("train.on_client_failure=ignore", "train.on_client_failure")],
)  # fmt: skip
def test_bad_deploy_settings_fail_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, fragment: str
) -> None:
    assert main(["deploy", str(REPO / "configs" / "deploy_smoke.yaml"), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim: error:") and fragment in err and "Traceback" not in err


def test_compose_rejects_zero_nodes_and_missing_certificates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compose", str(QUICKSTART), "--nodes", "0", "--out", str(tmp_path / "p")]) == 2
    assert "--nodes 0" in (err := capsys.readouterr().err) and "train.num_clients" in err
    assert not (tmp_path / "p").exists()
    certs = "deploy.certificates={ca: nope.pem, cert: nope.pem, key: nope.key}"
    assert main(["compose", str(QUICKSTART), "--out", str(tmp_path / "q"), "--set", "deploy.tls=true", certs]) == 2
    assert "deploy.certificates.ca" in (err := capsys.readouterr().err) and "nope.pem" in err



def test_a_config_that_does_not_fit_its_data_or_model_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the data is on this host, compose checks the config against it as fedsim run does (it wrote a project
    whose ServerApp failed only once the containers ran); data on the nodes' host only is theirs to check."""
    for bad, field in (("strategy.etf_dim=3", "strategy.etf_dim = 3"), ("model.norm=none", "model.norm: strategy")):
        name = "fedetf" if "etf" in bad else "fedbn"
        args = ["--set", f"strategy.name={name}", bad]
        assert main(["compose", str(QUICKSTART), "--out", str(tmp_path / "p"), *args]) == 2
        assert one_line(capsys.readouterr().err).startswith(f"fedsim: error: {field}")
        assert not (tmp_path / "p").exists()
    elsewhere = ["data.root=/srv/nodes-only/mnist_small.npz"]  # not on this host
    compose(QUICKSTART, tmp_path / "q", "--set", "strategy.name=fedetf", "strategy.etf_dim=3", *elsewhere)

def test_compose_writes_only_into_a_project_of_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    theirs = tmp_path / "theirs"
    (theirs / "state" / "supernode-7").mkdir(parents=True)
    (theirs / "compose.yaml").write_text("services: {mine: {image: busybox}}\n")
    (theirs / ".env").write_text("SECRET=mine\n")
    assert main(["compose", str(QUICKSTART), "--out", str(theirs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedsim: error: --out {theirs} ") and err.count("\n") == 1, err  # wording: the corpus
    assert (theirs / "compose.yaml").read_text() == "services: {mine: {image: busybox}}\n"
    assert (theirs / ".env").read_text() == "SECRET=mine\n" and sorted(p.name for p in theirs.iterdir()) == [
        ".env", "compose.yaml", "state",
    ]  # fmt: skip
    # its own project, written again for fewer nodes: the SuperNodes it no longer has leave no state behind
    ours = tmp_path / "ours"
    compose(QUICKSTART, ours, "--nodes", "4")
    assert (ours / ".fedsim").read_text() == "compose project\n"
    compose(QUICKSTART, ours, "--nodes", "2")
    assert sorted(p.name for p in (ours / "state").iterdir()) == ["superlink", "supernode-0", "supernode-1"]


@pytest.mark.parametrize("nodes", [1001, 10_000, 60_000])
def test_compose_bounds_its_supernodes_and_their_ports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nodes: int
) -> None:
    from fedsim.deploy.compose import MAX_NODES

    assert main(["compose", str(QUICKSTART), "--nodes", str(nodes), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err  # the option, its value and the bound (wording: tests/test_bad_inputs.py)
    assert err.startswith(f"fedsim: error: --nodes {nodes}: ") and "1,000" in err and err.count("\n") == 1, err
    assert not (tmp_path / "p").exists()
    topo = compose_topology(load_config(QUICKSTART, [f"train.num_clients={MAX_NODES}"]), "superlink")
    assert len(set(topo.node_ports)) == MAX_NODES and max(topo.node_ports) <= 65535


def test_a_project_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    disk_full_at(monkeypatch, "compose.yaml")
    out = tmp_path / "p"
    assert main(["compose", str(QUICKSTART), "--out", str(out)]) == 2
    err = capsys.readouterr().err  # the option, the file and the system's reason
    assert err.startswith(f"fedsim: error: --out {out}: ") and err.count("\n") == 1, err
    assert f"{out / 'compose.yaml'} (No space left on device)" in err, err


# the last four: digits and dots only, so an IPv4 address or nothing (999.1.1.1 was taken for a DNS name)
@pytest.mark.parametrize(
    "host",
    [
        "",
        "a b",
        "-x",
        "host-",
        "a\nb",
        "a\x1b[2Jb",
        "a..b",
        "x" * 64,
        "a/b",
        "a:1",
        "999.1.1.1",
        "1.2.3",
        "123",
        "1.2.3.4.",
    ],
)
@pytest.mark.parametrize("option", ["--superlink-host", "--tls-host"])
def test_a_host_that_is_no_dns_name_or_ip_address_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, host: str
) -> None:
    out = tmp_path / "p"
    assert main(["compose", str(QUICKSTART), "--out", str(out), "--set", "deploy.tls=true", f"{option}={host}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedsim: error: {option} {host!r}: ") and len(err.splitlines()) == 1, err
    assert "DNS name" in err and "IP address" in err, err  # what is allowed (wording: tests/test_bad_inputs.py)
    assert not out.exists()


def test_dns_names_and_ip_addresses_are_hosts(tmp_path: Path) -> None:
    project = compose(QUICKSTART, tmp_path / "p", "--superlink-host", "fd00::5", "--tls-host", "10.0.0.5",
                      "node_1.example.org.", "--set", "deploy.tls=true")  # fmt: skip
    assert "[fd00::5]:9093" in json.dumps(project)


@pytest.mark.parametrize("name", ["x${HOME}", "a${", "$$x$"])
def test_dollars_in_values_are_escaped_from_compose_interpolation(tmp_path: Path, name: str) -> None:
    # Compose interpolates $ everywhere in compose.yaml: x${HOME} would have named the run after the host's home
    services = compose(QUICKSTART, tmp_path, "--set", f"name={name}")["services"]
    submit = services["submit"]["entrypoint"]
    run_dir = submit[submit.index("--run-dir") + 1]
    assert run_dir == f"/fedsim/runs/{name.replace('$', '$$')}"  # Compose reads $$ as one $
    # fedsim's own variables stay variables
    assert services["superlink"]["user"] == "${FEDSIM_UID:-49999}:${FEDSIM_GID:-49999}"
    text = (tmp_path / "compose.yaml").read_text()
    assert re.findall(r"\$+\{?\w*", text.replace("$$", "")) == ["${FEDSIM_UID", "${FEDSIM_GID"] * len(services)


@pytest.mark.parametrize(
    "memory", ["99999999999999999999g", "1025g", "1099511627777", "1048577m", "1b", "100k", "5m", "1023m", "1023.9m"]
)
def test_node_memory_is_from_a_gibibyte_to_a_tebibyte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], memory: str
) -> None:
    # 99999999999999999999g overflowed the int64 byte count Docker reads a limit into; under 6 MB Docker refuses
    # the limit, and under 1g the SuperNode's warm process (torch, Flower, fedsim) is killed on its first Message
    out = tmp_path / "p"
    assert main(["compose", str(QUICKSTART), "--out", str(out), "--node-memory", memory]) == 2
    err = capsys.readouterr().err  # the option, its value and the bounds (wording: tests/test_bad_inputs.py)
    assert err.startswith(f"fedsim: error: --node-memory {memory!r}: ") and err.count("\n") == 1, err
    assert re.search(r"\b1g\b.*\b1024g\b", err), err
    assert not out.exists()
    for bound in ["1024g", "1g", "1024m"]:  # the bounds themselves are limits
        limits = compose(QUICKSTART, tmp_path / bound, "--node-memory", bound)["services"]["supernode-0"]["deploy"]
        assert limits["resources"]["limits"]["memory"] == bound


def data_in(tmp_path: Path, directory: str) -> Path:
    """The shipped MNIST subset in ``tmp_path/directory``: a data.root for fedsim compose to mount."""
    (tmp_path / directory).mkdir()
    (tmp_path / directory / "mnist_small.npz").symlink_to(MNIST_SMALL)
    return tmp_path / directory / "mnist_small.npz"


@pytest.mark.parametrize(
    ("directory", "held"), [("a}b", "'}'"), ("c$d", "'$'"), ("e:f g", "':'"), ("$}", "'$' and '}'")]
)
def test_a_data_directory_compose_cannot_mount_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], directory: str, held: str
) -> None:
    """``${FEDSIM_DATA:-<directory>}:/data:ro``: a ``}`` ended the default (a/b} mounted a, then b} after it),
    a ``:`` split the volume, and a ``$`` written ``$$`` was one ``$`` to Compose v2 but two to docker-compose 1.29."""
    root, out = data_in(tmp_path, directory), tmp_path / "project"
    assert main(["compose", str(QUICKSTART), "--out", str(out), "--set", f"data.root={root}"]) == 2
    err = capsys.readouterr().err  # the field, the directory and what in it (wording: tests/test_bad_inputs.py)
    assert err.startswith("fedsim: error: data.root: ") and err.count("\n") == 1, err
    assert f"{str(root.parent)!r}, " in err and f" {held};" in err, err
    assert not out.exists()  # refused before anything is written


def test_a_project_directory_holding_a_colon_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # docker-compose 1.29 makes ./runs absolute, then splits the volume at every ':'
    out = tmp_path / "a:b"
    assert main(["compose", str(QUICKSTART), "--out", str(out)]) == 2
    err = capsys.readouterr().err  # the option, the directory and the ':' (wording: tests/test_bad_inputs.py)
    assert err.startswith("fedsim: error: --out: ") and err.count("\n") == 1, err
    assert f"{str(out)!r}, " in err and " ':';" in err, err
    assert not out.exists()


def test_a_data_directory_with_spaces_quotes_and_braces_is_mounted_as_it_is(tmp_path: Path) -> None:
    directory = "a b'c\"d{e#f"
    root = data_in(tmp_path, directory)
    project = compose(QUICKSTART, tmp_path / "p q", "--set", f"data.root={root}")
    volume = f"${{FEDSIM_DATA:-{root.parent}}}:/data:ro"
    assert all(volume in project["services"][name]["volumes"] for name in ("superlink", "supernode-0"))
    if shutil.which("docker-compose") is not None:  # Debian 12's 1.29, which reads Compose files without an engine
        res = subprocess.run(["docker-compose", "config"], cwd=tmp_path / "p q", capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        mounted = yaml.safe_load(res.stdout)["services"]["supernode-0"]["volumes"]
        assert f"{root.parent}:/data:ro" in mounted, mounted
