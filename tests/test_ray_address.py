"""``simulation.ray_address`` (fedsim/engines/ray_address.py): the endpoint each form names, what is no Ray address,
when the address is checked at all, and the probe's answers from what listens on loopback (a refused port, a
silent one, a web server, an old GCS, one that wants a token). No Ray cluster is started here; a run joining one,
and `fedsim run` refusing what is not one within the probe's bound: tests/test_ray_cluster.py."""

from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path

import pytest
import ray

from fedsim.config_file import parse_config
from fedsim.engines import ray_address
from fedsim.engines.ray_address import _check_versions, check_ray_address, cluster_endpoint, probe_cluster
from fedsim.errors import ConfigError
from fedsim.ports import free_port
from tests.conftest import small_config
from tests.test_ray_cluster import old_ray_gcs, on_cluster, silent_listener, web_server

# the forms every refusal names
FORMS = "auto, host:port (the head's GCS, port 6379 by default) or ray://host:port (Ray Client, port 10001)"
GCS, CLIENT = "a Ray cluster's GCS", "a Ray Client server"


def test_auto_follows_ray_address_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    cfg = parse_config(small_config(tmp_path, **on_cluster("auto", "local")))
    with pytest.raises(ConfigError, match=r"simulation\.ray_address\b.*'auto'.*127\.0\.0\.1"):
        check_ray_address(cfg)


# --- the address's endpoint ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "endpoint"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("head.example.org:1", ("head.example.org", 1)),
        ("ray://head:10001", ("head", 10001)),
        ("[::1]:6379", ("::1", 6379)),
        ("ray://[fd00::5]:65535", ("fd00::5", 65535)),
    ],
)
def test_each_form_names_its_host_and_port(address: str, endpoint: tuple[str, int]) -> None:
    assert cluster_endpoint(address) == endpoint


@pytest.mark.parametrize(
    "address", ["head", ":6379", "head:", "head:0", "head:65536", "head:port", "head:-1", "http://head:6379", "ray://h"]
)
def test_what_is_no_ray_address_is_refused_naming_the_field_and_the_forms(address: str) -> None:
    with pytest.raises(ConfigError) as refused:
        cluster_endpoint(address, "nodes[1].address")
    assert str(refused.value) == f"nodes[1].address = {address!r} is not a Ray address; use {FORMS}"


def test_a_host_that_is_no_name_is_refused_as_the_host() -> None:
    with pytest.raises(ConfigError, match=r"^simulation\.ray_address = '-x:6379': the host '-x': give a DNS name"):
        cluster_endpoint("-x:6379")


def test_auto_is_ray_address_and_a_malformed_one_is_named_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.1.2.3:10001")
    assert cluster_endpoint("auto") == ("10.1.2.3", 10001)
    monkeypatch.setenv("RAY_ADDRESS", "nohost")
    with pytest.raises(ConfigError) as refused:
        cluster_endpoint("auto")
    expected = f"simulation.ray_address = 'auto' (from 'auto': 'nohost') is not a Ray address; use {FORMS}"
    assert str(refused.value) == expected


# --- when the address is checked -------------------------------------------------------------


def test_the_check_probes_an_address_where_clients_run_on_ray_and_only_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probed: list[str] = []
    monkeypatch.setattr(ray_address, "probe_cluster", probed.append)
    check_ray_address(parse_config(small_config(tmp_path)))  # no address: nothing to ask
    assert probed == []
    for engine in ("local", "flower"):
        check_ray_address(parse_config(small_config(tmp_path, **on_cluster("head:6379", engine))))
    assert probed == ["head:6379", "head:6379"]
    inline = parse_config(small_config(tmp_path, simulation={"ray_address": "head:6379"}))  # engine local, inline
    with pytest.raises(ConfigError) as refused:
        check_ray_address(inline)
    assert str(refused.value) == (
        "simulation.ray_address = 'head:6379' has no effect with engine 'local' and simulation.backend 'inline' "
        "(clients run in this process): set simulation.backend: ray, or engine: flower"
    )
    assert probed == ["head:6379", "head:6379"]


# --- the probe, against what listens on loopback ---------------------------------------------


def refusal(address: str, field: str = "simulation.ray_address") -> str:
    with pytest.raises(ConfigError) as refused:
        probe_cluster(address, field)
    return str(refused.value)


def test_a_port_that_refuses_is_no_cluster() -> None:
    port = free_port()
    assert refusal(f"ray://127.0.0.1:{port}") == (
        f"simulation.ray_address = 'ray://127.0.0.1:{port}': no Ray cluster answers at 127.0.0.1:{port} ([Errno 111] "
        f"Connection refused); start the cluster (`ray start --head` on its head node) or give a running one's "
        f"address: {FORMS}"
    )


def test_a_silent_port_ends_the_probe_at_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_address, "RAY_PROBE_TIMEOUT_S", 1.0)
    with silent_listener("127.0.0.1") as port:
        started = time.monotonic()
        said = refusal(f"ray://127.0.0.1:{port}", "x")
        took = time.monotonic() - started
    assert said == (
        f"x = 'ray://127.0.0.1:{port}': 127.0.0.1:{port} gave no answer in Ray's protocol within 1 s; give the "
        f"address of {CLIENT}: {FORMS}"
    )
    assert 0.9 < took < 6  # the bound set here: not the default 10 s, nor Ray's own retries (minutes)


def test_a_web_server_is_no_ray_client_server() -> None:
    with web_server("127.0.0.1") as port:
        said = refusal(f"ray://127.0.0.1:{port}")
    answers = rf"127\.0\.0\.1:{port} answers, but not as {CLIENT} \((?!DEADLINE_EXCEEDED)[A-Z_]+: .+\)"
    assert re.fullmatch(rf"simulation\.ray_address = 'ray://127\.0\.0\.1:{port}': {answers}; give the address of "
                        rf"{CLIENT}: {re.escape(FORMS)}", said), said  # fmt: skip


def test_auto_that_names_a_ray_client_server_is_probed_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """ray.init('auto') follows RAY_ADDRESS=ray://... to a Ray Client server; the probe took it for a GCS,
    dialled this host's network address and refused what answered as not a GCS."""
    with web_server("127.0.0.1") as port:
        monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{port}")
        said = refusal("auto")
    assert f"127.0.0.1:{port} answers, but not as {CLIENT} (" in said and "this host's address" not in said, said


@pytest.fixture
def gcs_dialled_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray dials a GCS given as 127.0.0.1 at this host's network address; here, at 127.0.0.1 as given."""
    import ray._private.services

    monkeypatch.setattr(ray._private.services, "resolve_ip_for_localhost", lambda host: host)


@pytest.mark.usefixtures("gcs_dialled_as_given")
def test_a_gcs_of_other_versions_is_refused_naming_both() -> None:
    with old_ray_gcs("127.0.0.1") as port:
        said = refusal(f"127.0.0.1:{port}")
    python = platform.python_version()
    assert said == (
        f"simulation.ray_address = '127.0.0.1:{port}': the cluster at 127.0.0.1:{port} runs Ray 1.13.0 on Python "
        f"{python}, and fedsim here Ray {ray.__version__} on Python {python}: Ray joins a cluster of the same "
        "versions only; install the same Ray and Python on every node and here"
    )


@pytest.mark.usefixtures("gcs_dialled_as_given")
def test_a_gcs_that_wants_a_token_says_how_to_give_it() -> None:
    with old_ray_gcs("127.0.0.1", token=True) as port:
        said = refusal(f"127.0.0.1:{port}")
    assert said == (
        f"simulation.ray_address = '127.0.0.1:{port}': the cluster at 127.0.0.1:{port} wants a token this process "
        "lacks ('InvalidAuthToken: Authentication token is missing'); export RAY_AUTH_MODE=token and the cluster's "
        "token (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) before fedsim starts"
    )


# --- the versions a cluster keeps ------------------------------------------------------------


def test_a_cluster_that_keeps_no_versions_or_these_is_joined() -> None:
    here = {"ray_version": ray.__version__, "python_version": platform.python_version()}
    for metadata in (b"", json.dumps(here).encode()):
        assert _check_versions("given", "h:1", metadata, GCS) is None


@pytest.mark.parametrize("metadata", [b"not json", b'{"ray_version": "2.0.0"}', b"[1, 2]"])
def test_versions_kept_in_no_form_of_rays_are_no_gcs(metadata: bytes) -> None:
    with pytest.raises(ConfigError) as refused:
        _check_versions("simulation.ray_address = 'h:1'", "h:1", metadata, GCS)
    assert str(refused.value) == (
        f"simulation.ray_address = 'h:1': h:1 answers, but not as {GCS} (it keeps {metadata!r} for the cluster's "
        f"versions); give the address of {GCS}: {FORMS}"
    )
