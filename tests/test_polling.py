"""PromptGrid: a ServerApp's replies are taken as they come (Flower's HttpGrid sleeps 3 s between pulls)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from flwr.serverapp import Grid

from fedsim.server.polling import PromptGrid


class SlowNodes(Grid):
    """Replies to each pushed message ``delay`` seconds after it was pushed (never, for node 99). Messages
    are stand-ins with the fields PromptGrid reads (a real Message needs a Flower run around it)."""

    def __init__(self, delay: float) -> None:
        self.delay, self.pushed, self.pulls = delay, {}, 0

    def set_run(self, run: object) -> None: ...

    @property
    def run(self) -> object: ...

    def create_message(self, *args: object, **kwargs: object) -> Any: ...

    def send_and_receive(self, *args: object, **kwargs: object) -> Any:
        raise AssertionError("PromptGrid must not call the wrapped grid's send_and_receive (its fixed sleeps)")

    def get_node_ids(self) -> Iterable[int]:
        return [1, 2]

    def push_messages(self, messages: Iterable[Any]) -> Iterable[str]:
        ids = []
        for i, m in enumerate(messages):
            self.pushed[f"m{i}"] = (m.metadata.dst_node_id, time.monotonic())
            ids.append(f"m{i}")
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Any]:
        self.pulls += 1
        now, replies = time.monotonic(), []
        for mid in message_ids:
            node, at = self.pushed[mid]
            if node != 99 and now - at >= self.delay:
                replies.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid, src_node_id=node)))
        return replies


def messages(*nodes: int) -> list[Any]:
    return [SimpleNamespace(metadata=SimpleNamespace(dst_node_id=n)) for n in nodes]


def test_replies_are_taken_within_a_poll_of_their_arrival() -> None:
    grid = SlowNodes(delay=0.3)
    start = time.monotonic()
    replies = list(PromptGrid(grid).send_and_receive(messages(1, 2), timeout=60))
    took = time.monotonic() - start
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]
    # HttpGrid takes 3 s here (its first pull finds nothing, then it sleeps 3 s); PromptGrid a poll (0.1 s)
    # after the replies; the bound is just below HttpGrid's 3.3 s, for all the margin a loaded machine may need
    assert 0.3 <= took < 3.2
    assert grid.pulls >= 2


def test_a_missing_reply_ends_the_wait_at_the_timeout_with_the_others() -> None:
    start = time.monotonic()
    replies = list(PromptGrid(SlowNodes(delay=0.0)).send_and_receive(messages(1, 99), timeout=0.5))
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 0.5 <= time.monotonic() - start < 30  # the timeout ends it, not a reply that never comes
