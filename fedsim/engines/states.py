"""The nodes a worker serves, with their client state in memory up to a budget and on disk beyond.

Client state that crosses rounds (SCAFFOLD's c_i, FedBN's local tensors) lives in each node's Flower
``Context.state``. A worker that serves every client of a 1,000-client federation (the inline engine)
would keep 1,000 of them: 3 GB for SCAFFOLD's c_i of the paper CNN. :class:`NodeStates` keeps the
most recently used states in memory up to ``simulation.state_memory_mb`` and writes the others to a
directory of its own (Flower's protobuf form: the arrays byte for byte), so memory grows with the
clients a round touches, not with the federation. A node's Context itself is made when the node is
first served and dropped once its state is empty or on disk: a million-client federation holds the
contexts of the clients it is serving, not a million. Checkpoints and resume are unchanged: they read
and write ``Context.state`` through the ClientApp, which always sees a node's whole state.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from flwr.app import Context

from fedsim.client.state import decode, encode


def state_bytes(context: Context) -> int:
    """The bytes a node's state holds in arrays (its config and metric records are small)."""
    return sum(len(a.data) for record in context.state.array_records.values() for a in record.values())


class NodeStates:
    """Node id -> Context for the nodes ``nodes``, each made by ``make`` when first served, with states spilled to
    disk, least recently used first, beyond ``budget_bytes``."""

    def __init__(self, make: Callable[[int], Context], nodes: Collection[int], budget_bytes: int) -> None:
        self.make, self.nodes = make, nodes
        self.contexts: dict[int, Context] = {}  # the nodes with state in memory, or being served
        self.budget = budget_bytes
        self.resident: OrderedDict[int, int] = OrderedDict()  # node -> bytes in memory, least recent first
        self.spilled: set[int] = set()
        self.in_service: list[int] = []  # the nodes being served now (named when serving them overruns)
        self._dir: Path | None = None

    def node_ids(self) -> Collection[int]:
        return self.nodes

    def adopt(self, nodes: Collection[int]) -> None:
        """Serve ``nodes`` too (their state empty)."""
        self.nodes = {*self.nodes, *nodes}

    def context(self, node: int) -> Context:
        """The node's Context (its state is in memory only within :meth:`serving`)."""
        if node not in self.contexts:
            self.contexts[node] = self.make(node)
        return self.contexts[node]

    def load(self, node: int) -> None:
        """Put the node's whole state in memory (read back from disk if it was spilled)."""
        context = self.context(node)
        if node in self.spilled:
            context.state.update(decode(self._path(node).read_bytes()))
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
            elif not self.contexts[node].state:  # nothing to keep: made again if served again
                del self.contexts[node]
        while self.resident and sum(self.resident.values()) > self.budget:
            node, _ = self.resident.popitem(last=False)
            self._path(node).write_bytes(encode(self.contexts.pop(node).state))
            self.spilled.add(node)

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _path(self, node: int) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="fedsim-client-states-"))
        return self._dir / f"node-{node}.bin"
