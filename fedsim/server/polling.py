"""A ServerApp's Grid that waits for replies without Flower's fixed sleep between pulls.

Under a SuperLink, Flower hands the ServerApp an ``HttpGrid`` whose ``send_and_receive`` pulls the replies
and sleeps a fixed 3 s whenever some are missing: a phase of a round (training, evaluation, the partition
query, a checkpoint's state messages) ends on average 1.5 s after its last reply came in. fedsim's
round loop needs nothing else of ``send_and_receive``, so :class:`PromptGrid` does the same through the
Grid's public ``push_messages`` / ``pull_messages``, pulling every 0.1 s (a pull is one small request).
A wrapper that acts at every pull (the ``flower`` engine's: a stop, a message to send again) builds on it
by overriding ``pull_messages``, which Flower's own ``send_and_receive`` would bypass. Both build on
:class:`GridView`, as does :class:`OfferedGrid`, the round loop's grid of the clients it sampled.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run

POLL_S = 0.1


class GridView(Grid):
    """``grid``, every method delegated: the base of a wrapper that changes one."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.grid.send_and_receive(messages, timeout=timeout)


class OfferedGrid(GridView):
    """``grid`` listing only ``nodes``: what the round loop offers a strategy to configure (the sampled clients)."""

    def __init__(self, grid: Grid, nodes: list[int]) -> None:
        super().__init__(grid)
        self.nodes = nodes

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)


class PromptGrid(GridView):
    """``grid`` with :meth:`send_and_receive` pulling every :data:`POLL_S` seconds; the rest delegated."""

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``; the replies that came within ``timeout`` seconds (None: wait for all)."""
        waiting = set(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while waiting:
            pulled = list(self.pull_messages(waiting))
            replies += pulled
            waiting -= {m.metadata.reply_to_message_id for m in pulled}
            if not waiting or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic())))
        return replies
