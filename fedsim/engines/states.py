"""The nodes a worker serves, with their client state in memory up to a budget and on disk beyond.

Client state that crosses rounds (SCAFFOLD's c_i, FedBN's local tensors) lives in each node's Flower
``Context.state``. A worker that serves every client of a 1,000-client federation (the inline engine)
would keep 1,000 of them: 3 GB for SCAFFOLD's c_i of the paper CNN. :class:`NodeStates` keeps the
most recently used states in memory up to ``simulation.state_memory_mb`` and writes the others to a
directory of its own (Flower's protobuf form: the arrays byte for byte), so memory grows with the
clients a round touches, not with the federation. Checkpoints and resume are unchanged: they read
and write ``Context.state`` through the ClientApp, which always sees a node's whole state.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from flwr.app import Context

from fedsim.client.state import decode, encode


def state_bytes(context: Context) -> int:
    """The bytes a node's state holds in arrays (its config and metric records are small)."""
    return sum(len(a.data) for record in context.state.array_records.values() for a in record.values())


class NodeStates:
    """Node id -> Context, with states spilled to disk, least recently used first, beyond ``budget_bytes``."""

    def __init__(self, contexts: dict[int, Context], budget_bytes: int) -> None:
        self.contexts = contexts
        self.budget = budget_bytes
        self.resident: OrderedDict[int, int] = OrderedDict()  # node -> bytes in memory, least recent first
        self.spilled: set[int] = set()
        self.in_service: list[int] = []  # the nodes being served now (named when serving them overruns)
        self._dir: Path | None = None

    def node_ids(self) -> list[int]:
        return list(self.contexts)

    def load(self, node: int) -> None:
        """Put the node's whole state in memory (read back from disk if it was spilled)."""
        if node in self.spilled:
            self.contexts[node].state.update(decode(self._path(node).read_bytes()))
            self._path(node).unlink()
            self.spilled.discard(node)

    @contextlib.contextmanager
    def serving(self, nodes: list[int]) -> Iterator[None]:
        """Within: ``nodes``' whole states in memory. After: settled (spilled beyond the budget)."""
        for node in nodes:
            self.load(node)
        self.in_service = nodes
        try:
            yield
        finally:
            self.in_service = []
            self.settle(nodes)

    def settle(self, nodes: list[int]) -> None:
        """After ``nodes`` were served: count their states, then spill the least recent beyond the budget."""
        for node in nodes:
            self.resident.pop(node, None)
            if size := state_bytes(self.contexts[node]):
                self.resident[node] = size
        while self.resident and sum(self.resident.values()) > self.budget:
            node, _ = self.resident.popitem(last=False)
            self._path(node).write_bytes(encode(self.contexts[node].state))
            self.contexts[node].state.clear()
            self.spilled.add(node)

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _path(self, node: int) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="fedsim-client-states-"))
        return self._dir / f"node-{node}.bin"
