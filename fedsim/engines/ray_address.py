"""``simulation.ray_address``: what it names, and whether a Ray cluster that this process can join answers there.

Asked in Ray's own protocol, from Python, within ``RAY_PROBE_TIMEOUT_S`` (fedsim.config), before ``ray.init``
goes near the address: ``ray.init`` gives a GCS that does not answer as Ray 20 tries of up to 30 s each, in C++
calls that no Ctrl-C or SIGTERM reaches. The probe's calls share one deadline, and gRPC looks for signals while
it waits, so a Ctrl-C or SIGTERM ends the wait at once. It asks what joining asks first, where ``ray.init``
asks it (a GCS given as 127.0.0.1 is dialled at this host's network address), over the channel Ray's own
clients use (``RAY_USE_TLS`` and token authentication as Ray reads them): a GCS (``host:port``) for its
cluster id, then for the Ray and Python versions the cluster was started with (Ray refuses a driver of other
versions, at Ray's own level, ``RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL``); a Ray Client server (``ray://``)
for the ping its clients send first (the Ray Client checks versions itself as it connects).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time

from fedsim.config import RAY_PROBE_TIMEOUT_S, RunConfig
from fedsim.errors import ConfigError, brief
from fedsim.names import check_host, host_port

FIELD = "simulation.ray_address"
FORMS = "auto, host:port (the head's GCS, port 6379 by default) or ray://host:port (Ray Client, port 10001)"


def _auto_address(field: str) -> str:
    # ray.init's own order for "auto": RAY_ADDRESS, then the cluster `ray start` last started here
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except (ConnectionError, ValueError) as err:
        raise ConfigError(
            f"{field} = 'auto', but no running Ray cluster was found: RAY_ADDRESS is not set and "
            "`ray start --head` was not run on this machine; start one or give its address"
        ) from err


def cluster_endpoint(address: str, field: str = FIELD) -> tuple[str, int]:
    """The host and port that ``address`` connects to; ``auto`` resolved as ``ray.init`` does."""
    resolved = _auto_address(field) if address == "auto" else address
    host, sep, port = resolved.removeprefix("ray://").rpartition(":")
    if not sep or not host or "/" in host or not port.isdigit() or not 0 < int(port) <= 65535:
        via = f" (from 'auto': {resolved!r})" if resolved != address else ""
        raise ConfigError(f"{field} = {address!r}{via} is not a Ray address; use {FORMS}")
    return check_host(host.strip("[]"), f"{field} = {address!r}: the host"), int(port)


def check_ray_address(cfg: RunConfig) -> None:
    """Fail before training when ``simulation.ray_address`` is unused or no Ray cluster to join answers there."""
    address = cfg.simulation.ray_address
    if address is None:
        return
    if cfg.engine == "local" and cfg.simulation.backend == "inline":
        raise ConfigError(
            f"{FIELD} = {address!r} has no effect with engine 'local' and simulation.backend 'inline' "
            "(clients run in this process): set simulation.backend: ray, or engine: flower"
        )
    probe_cluster(address)


def probe_cluster(address: str, field: str = FIELD) -> None:
    """Return once a Ray cluster that this process can join answers at ``address``; else, within
    ``RAY_PROBE_TIMEOUT_S``, one ConfigError naming ``field`` and what answered instead."""
    import grpc
    from ray._private.services import resolve_ip_for_localhost

    host, port = cluster_endpoint(address, field)
    client = (_auto_address(field) if address == "auto" else address).startswith("ray://")  # as ray.init follows auto
    dialled = host if client else resolve_ip_for_localhost(host)  # as ray.init dials a GCS
    endpoint = host_port(dialled, port)
    at = endpoint if dialled == host else f"{host_port(host, port)} (Ray dials it at this host's address, {endpoint})"
    given = f"{field} = {address!r}"
    started = time.monotonic()
    try:
        socket.create_connection((dialled, port), timeout=RAY_PROBE_TIMEOUT_S).close()
    except OSError as err:
        raise ConfigError(
            f"{given}: no Ray cluster answers at {at} ({err}); start the cluster (`ray start --head` on its head "
            f"node) or give a running one's address: {FORMS}"
        ) from err
    server = "a Ray Client server" if client else "a Ray cluster's GCS"
    budget = RAY_PROBE_TIMEOUT_S - (time.monotonic() - started)  # what the connection left
    try:
        if client:
            _ping_client(endpoint, budget)
        else:
            _check_versions(given, at, _cluster_metadata(endpoint, budget), server)
    except grpc.RpcError as err:
        code, details = err.code(), " ".join(str(err.details()).split())
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise ConfigError(
                f"{given}: the cluster at {at} wants a token this process lacks ({brief(details, 200)}); export "
                "RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) before fedsim "
                "starts"
            ) from err
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            cause = f"{at} gave no answer in Ray's protocol within {RAY_PROBE_TIMEOUT_S:g} s"
        else:
            cause = f"{at} answers, but not as {server} ({code.name}: {brief(details, 200)})"
        raise ConfigError(f"{given}: {cause}; give the address of {server}: {FORMS}") from err


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


def _ping_client(endpoint: str, budget: float) -> None:
    """The ping a Ray Client sends first (its server answers it before anything else), within ``budget`` s."""
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    deadline = time.monotonic() + budget  # from here: loading Ray's modules is no wait for an answer
    with init_grpc_channel(endpoint) as channel:
        ping = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)
        ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(ping, timeout=_remaining(deadline))


def _cluster_metadata(endpoint: str, budget: float) -> bytes:
    """The cluster id that joining asks a GCS for first, then what the cluster keeps of its versions (empty if
    nothing: Ray then checks none), within ``budget`` s."""
    from ray._common.usage.usage_constants import CLUSTER_METADATA_KEY
    from ray._private.gcs_utils import create_gcs_channel
    from ray._private.ray_constants import KV_NAMESPACE_CLUSTER
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    deadline = time.monotonic() + budget
    with create_gcs_channel(endpoint) as channel:
        nodes = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        nodes.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=_remaining(deadline))
        kv = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
        ask = gcs_service_pb2.InternalKVGetRequest(key=CLUSTER_METADATA_KEY, namespace=KV_NAMESPACE_CLUSTER)
        reply = kv.InternalKVGet(ask, timeout=_remaining(deadline))
    return reply.value if reply.status.code == 0 else b""


def _check_versions(given: str, endpoint: str, metadata: bytes, server: str) -> None:
    """Ray's own test of a driver's versions against those the cluster keeps, as one line."""
    import ray
    from ray._private.utils import check_version_info

    if not metadata:
        return
    try:
        kept = json.loads(metadata)
        versions = {key: str(kept[key]) for key in ("ray_version", "python_version")}
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(
            f"{given}: {endpoint} answers, but not as {server} (it keeps {brief(metadata)} for the cluster's "
            f"versions); give the address of {server}: {FORMS}"
        ) from err
    try:
        check_version_info(versions, "fedsim here")
    except RuntimeError as err:
        raise ConfigError(
            f"{given}: the cluster at {endpoint} runs Ray {versions['ray_version']} on Python "
            f"{versions['python_version']}, and fedsim here Ray {ray.__version__} on Python "
            f"{platform.python_version()}: Ray joins a cluster of the same versions only; install the same Ray "
            "and Python on every node and here"
        ) from err
