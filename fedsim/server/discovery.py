"""Which node holds which partition, and on which data: the first thing fedsim's ServerApp asks every node.

A node answers once it has read the run's data (its runtime, built from the run config the query carries,
is the one its rounds use), so a node whose host holds other data at ``data.root`` is refused here, before
round 1 and whatever ``train.on_client_failure`` says: other data is a misconfigured run, not a node failure.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedsim import wire
from fedsim.config import RunConfig
from fedsim.data.fingerprint import check_node_data
from fedsim.errors import FedsimError, ProtocolError

# Flower's ClientApp answers a query it has no handler for with an error whose reason says so
_NO_HANDLER = "No query function registered"


class ShiftedIds(Mapping[int, int]):
    """``key -> key + shift`` for keys ``start .. start + count - 1``: the partition -> node map of nodes this
    process serves (fedsim's local grid), held in two numbers rather than a dict of a million entries."""

    def __init__(self, start: int, count: int, shift: int) -> None:
        self.start, self.count, self.shift = start, count, shift

    def __getitem__(self, key: int) -> int:
        if not self.start <= key < self.start + self.count:
            raise KeyError(key)
        return key + self.shift

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.start + self.count))

    def __len__(self) -> int:
        return self.count

    def inverse(self) -> ShiftedIds:
        return ShiftedIds(self.start + self.shift, self.count, -self.shift)


def invert(mapping: Mapping[int, int]) -> Mapping[int, int]:
    """``mapping`` the other way round (node -> partition from partition -> node)."""
    if isinstance(mapping, ShiftedIds):
        return mapping.inverse()
    return {v: k for k, v in mapping.items()}


def discover_partitions(grid: Grid, cfg: RunConfig, data_sha256: str, wait_s: float = 600.0) -> Mapping[int, int]:
    """Partition id -> node id for every node, each of which read the data of fingerprint ``data_sha256``;
    waits until ``train.num_clients`` nodes are connected. A grid that serves its nodes in this process
    (``known_partitions``) states the map itself: one of its nodes answers the query (its runtime is the
    process's), not each of a million."""
    num_clients = cfg.train.num_clients
    known = getattr(grid, "known_partitions", lambda: None)()
    if known is not None:
        found = _query(grid, cfg, data_sha256, [known[0]], wait_s)
        if found != {0: known[0]}:
            raise FedsimError(f"node {known[0]} answers partition {sorted(found)}, expected 0")
        return known
    deadline = time.monotonic() + wait_s
    while len(node_ids := list(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise FedsimError(f"only {len(node_ids)} of {num_clients} client nodes connected in {wait_s:.0f} s")
        time.sleep(0.5)
    mapping = _query(grid, cfg, data_sha256, node_ids, wait_s)
    if sorted(mapping) != list(range(num_clients)):
        raise FedsimError(
            f"nodes hold partitions {sorted(mapping)}, expected 0..{num_clients - 1} (train.num_clients)"
        )
    return mapping


def _query(grid: Grid, cfg: RunConfig, data_sha256: str, node_ids: list[int], wait_s: float) -> dict[int, int]:
    """Partition id -> node id of ``node_ids``, each checked to have read the run's data."""
    config_json = cfg.to_json()  # the node reads the run's data from it, as its rounds will
    queries = [
        Message(
            RecordDict({wire.CONFIG: ConfigRecord({wire.RUN_CONFIG: config_json})}),
            dst_node_id=n,
            message_type=wire.QUERY_PARTITION,
        )
        for n in node_ids
    ]
    mapping: dict[int, int] = {}
    for reply in grid.send_and_receive(queries, timeout=wait_s):
        node = reply.metadata.src_node_id
        if reply.has_error():
            if _NO_HANDLER in reply.error.reason:
                raise ProtocolError(
                    f"node {node} does not run fedsim's ClientApp: it has no {wire.QUERY_PARTITION!r} handler. "
                    "fedsim's ServerApp needs its client protocol (docs/protocol.md): the partition query, "
                    "train and evaluate replies with 'partition-id', 'num-examples', 'train-loss', 'correct' "
                    "and 'eval-loss'; run fedsim's ClientApp (fedsim.deploy.clientapp:app) on every node"
                )
            raise FedsimError(f"node {node} failed the partition query: {reply.error.reason}")
        pid = wire.partition_of(reply)
        check_node_data(node, pid, wire.data_sha256_of(reply), data_sha256, cfg.data.root)
        if pid in mapping:
            raise FedsimError(f"two nodes claim partition {pid}: check each node's partition-id")
        mapping[pid] = node
    return mapping
