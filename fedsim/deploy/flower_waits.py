"""Flower's fixed waits in a deployment, shortened: the one place where fedsim changes Flower internals.

Flower 1.41's SuperNode loop (``flwr.supernode.start_client_internal``) sleeps 3 s whenever a pull from
the SuperLink finds no Message, and looks for its ClientApp's reply, and for each object of the reply,
every 0.5 s, all hard-coded. So a Message that reaches the SuperLink just after a node's empty pull
waits up to 3 s, and every reply waits 0.25 s more on average: several seconds of every deployed round,
where the work of a round is about a second.

And whoever pulls a Message's objects (a ClientApp from its SuperNode, a SuperNode or the ServerApp from
the SuperLink) retries an object that is not stored yet after 1 s, doubling. A SuperNode creates the
ClientApp's task before it has pulled the Message's objects, so a ClientApp that starts at once (forked,
:mod:`fedsim.deploy.forkserver`) finds them missing and waits that second on every Message.

Its SuperExec (a process of its own, ``flwr.supercore.superexec.run_superexec``) looks for a task to start
a ClientApp for every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` seconds, one HTTP request to the SuperNode
each: an idle cost for both, and half an interval of latency on every Message. :func:`ring_when_stored`
makes the SuperNode ring a doorbell (a FIFO, :class:`Doorbell`) once a Message and all its objects are
stored, and :func:`wake_on_doorbell` makes the SuperExec's wait between looks end at a ring, so it looks
at once, finds a task whose input is complete, and otherwise looks only every
:data:`DOORBELL_FALLBACK_S` (Flower's default interval: a ring that could be lost costs no more than
Flower's own poll).

A SuperNode also tells the SuperLink it sends a heartbeat every 30 s, so a node that dies is declared
dead (and its Messages answered with an error) only after 60 s; Flower's SuperLink accepts intervals
from :data:`HEARTBEAT_S` = 10 s, which :func:`shorten_heartbeat` announces: 20 s.

:func:`shorten_node_loop` replaces the loop's sleeps with :data:`IDLE_POLL_S` and :data:`REPLY_POLL_S`;
:func:`shorten_object_pulls` starts the retries at :data:`PULL_RETRY_S` (same doubling, same caps and
limits). They run only in the processes of a deployment that fedsim starts or serves: ``fedsim-supernode``
(:mod:`fedsim.deploy.supernode`), its SuperExec (:mod:`fedsim.deploy.superexec`) and fork server, and
fedsim's ServerApp under a SuperLink; never in
``fedsim run``. Each applies only to the Flower version fedsim pins, and only if Flower's code still
has exactly the waits described here; otherwise it changes nothing and says so, and
``tests/test_flower_waits.py`` fails, so that a Flower upgrade is checked here first.
"""

from __future__ import annotations

import inspect
import os
import re
import select
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

FLOWER_VERSION = "1.41.0"
IDLE_POLL_S = 0.1  # an idle node pulls 10 times a second: ~1 ms of CPU each for it and the SuperLink
REPLY_POLL_S = 0.01  # a local look at the node's own state
HEARTBEAT_S = 10  # the shortest interval Flower's SuperLink accepts (HEARTBEAT_MIN_INTERVAL); Flower: 30
PULL_RETRY_S = 0.02  # the first retry of an object not stored yet; then doubling to Flower's cap of 10 s
SLEEPS = {"time.sleep(3)": 1, "time.sleep(0.5)": 2}  # the calls the module must have, and how often
SHORTER = {3: IDLE_POLL_S, 0.5: REPLY_POLL_S}
DOORBELL_FALLBACK_S = 1.0  # the SuperExec's look for a task when no ring came: Flower's default interval
SUPEREXEC_WAIT = "time.sleep(task_poll_interval)"  # the SuperExec loop's one wait, and its only use of time


class ShortSleeps:
    """The ``time`` module as the SuperNode loop sees it: its sleeps of 3 s and 0.5 s shortened."""

    def sleep(self, seconds: float) -> None:
        time.sleep(SHORTER.get(seconds, seconds))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class Doorbell:
    """A FIFO that a SuperNode rings and its SuperExec waits on. Both ends open it for reading and writing,
    so that neither blocks on opening, a ring before the SuperExec opened it stays in the pipe, and a
    reader never sees end-of-file (which would wake it at once, forever)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)

    @staticmethod
    def make(path: str) -> Doorbell:
        os.mkfifo(path, 0o600)
        return Doorbell(path)

    def ring(self) -> None:
        try:
            os.write(self.fd, b"\0")
        except BlockingIOError:
            pass  # a full pipe already holds rings the SuperExec has not heard yet: it will look

    def wait(self, seconds: float) -> None:
        """Until a ring (those that came meanwhile included) or ``seconds`` pass."""
        if select.select([self.fd], [], [], seconds)[0]:
            try:
                while os.read(self.fd, 4096):
                    pass
            except BlockingIOError:
                pass


class DoorbellSleeps:
    """The ``time`` module as the SuperExec loop sees it: its wait between looks for a task ends at a ring."""

    def __init__(self, doorbell: Doorbell) -> None:
        self.doorbell = doorbell

    def sleep(self, seconds: float) -> None:
        self.doorbell.wait(DOORBELL_FALLBACK_S)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def unchanged(module: ModuleType, version: str) -> str | None:
    """Why the loop's patch does not fit (``None`` if it does): another Flower, or other sleeps in the loop."""
    if version != FLOWER_VERSION:
        return f"Flower {version} is not the {FLOWER_VERSION} this was written for"
    source = inspect.getsource(module)
    for call, count in SLEEPS.items():
        if source.count(call) != count:
            return f"{module.__name__} has {source.count(call)} calls of {call}, not {count}"
    if len(re.findall(r"\btime\.\w+\(", source)) != sum(SLEEPS.values()):
        return f"{module.__name__} calls the time module beyond its sleeps"
    return None


def superexec_unchanged(version: str) -> str | None:
    """Why the doorbell does not fit (``None`` if it does): another Flower, a SuperExec loop with other uses
    of time, or a SuperNode loop that no longer stores Messages through ``_pull_and_store_message``."""
    from flwr.supercore.superexec import run_superexec
    from flwr.supernode import start_client_internal

    if version != FLOWER_VERSION:
        return f"Flower {version} is not the {FLOWER_VERSION} this was written for"
    source = inspect.getsource(run_superexec)
    if source.count(SUPEREXEC_WAIT) != 1 or len(re.findall(r"\btime\.\w+\(", source)) != 1:
        return f"{run_superexec.__name__} uses the time module other than by one {SUPEREXEC_WAIT}"
    if inspect.getsource(start_client_internal).count("run_id = _pull_and_store_message(") != 1:
        return f"{start_client_internal.__name__} stores Messages other than by one _pull_and_store_message call"
    return None


def pull_functions() -> list[Any]:
    """Flower's functions that pull a Message's objects, each with its retry delay as a keyword default."""
    from flwr.supercore.inflatable import inflatable_utils

    return [inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree]


def pulls_unchanged(version: str) -> str | None:
    """Why the object pulls' patch does not fit (``None`` if it does)."""
    if version != FLOWER_VERSION:
        return f"Flower {version} is not the {FLOWER_VERSION} this was written for"
    for fn in pull_functions():
        first = (fn.__kwdefaults__ or {}).get("initial_backoff")
        if first not in (1, PULL_RETRY_S):
            return f"{fn.__module__}.{fn.__name__} retries first after {first!r} s, not 1 s"
    return None


def heartbeat_modules() -> list[ModuleType]:
    """The SuperNode's modules that read Flower's heartbeat interval: its connection and its sender."""
    from flwr.supercore import heartbeat
    from flwr.supernode import fleet_http_connection

    return [fleet_http_connection, heartbeat]


def heartbeat_unchanged(version: str) -> str | None:
    """Why the heartbeat's patch does not fit (``None`` if it does)."""
    from flwr.common import constant

    if version != FLOWER_VERSION:
        return f"Flower {version} is not the {FLOWER_VERSION} this was written for"
    if constant.HEARTBEAT_MIN_INTERVAL != HEARTBEAT_S:
        return f"the SuperLink accepts heartbeats from {constant.HEARTBEAT_MIN_INTERVAL} s, not {HEARTBEAT_S} s"
    for module in heartbeat_modules():
        if getattr(module, "HEARTBEAT_DEFAULT_INTERVAL", None) != constant.HEARTBEAT_DEFAULT_INTERVAL:
            return f"{module.__name__} does not read Flower's HEARTBEAT_DEFAULT_INTERVAL"
    return None


def _apply(what: str, why: str | None, patch: Callable[[], None]) -> bool:
    """``patch()`` unless ``why`` says it does not fit this Flower; then a warning, and nothing changes."""
    if why:
        print(f"fedsim: Flower's {what} are left as they are: {why}", file=sys.stderr)
        return False
    patch()
    return True


def shorten_node_loop() -> bool:
    """Shorten the SuperNode loop's sleeps in this process; False (and a warning) where they do not fit."""
    import flwr
    from flwr.supernode import start_client_internal

    def patch() -> None:
        start_client_internal.time = ShortSleeps()  # type: ignore[assignment]

    return _apply("SuperNode waits", unchanged(start_client_internal, flwr.__version__), patch)


def shorten_heartbeat() -> bool:
    """Announce and send this SuperNode's heartbeat every :data:`HEARTBEAT_S` seconds."""
    import flwr

    def patch() -> None:
        for module in heartbeat_modules():
            module.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT_S  # type: ignore[attr-defined]

    return _apply("SuperNode heartbeats", heartbeat_unchanged(flwr.__version__), patch)


def shorten_object_pulls() -> bool:
    """Start the retries of object pulls at :data:`PULL_RETRY_S` in this process (and what it forks)."""
    import flwr

    def patch() -> None:
        for fn in pull_functions():
            fn.__kwdefaults__["initial_backoff"] = PULL_RETRY_S

    return _apply("object pull retries", pulls_unchanged(flwr.__version__), patch)


def ring_when_stored(doorbell: Doorbell) -> bool:
    """Ring ``doorbell`` whenever this SuperNode has stored a Message with all its objects."""
    import flwr
    from flwr.supernode import start_client_internal

    store = start_client_internal._pull_and_store_message

    def pull_and_store(*args: Any, **kwargs: Any) -> int | None:
        run_id = store(*args, **kwargs)
        if run_id is not None:  # a Message and its objects are in the node's state: its task can start
            doorbell.ring()
        return run_id

    def patch() -> None:
        start_client_internal._pull_and_store_message = pull_and_store

    return _apply("SuperExec polls", superexec_unchanged(flwr.__version__), patch)


def wake_on_doorbell(doorbell: Doorbell) -> bool:
    """In a SuperExec: look for a task when ``doorbell`` rings, else every :data:`DOORBELL_FALLBACK_S`."""
    import flwr
    from flwr.supercore.superexec import run_superexec

    def patch() -> None:
        run_superexec.time = DoorbellSleeps(doorbell)  # type: ignore[assignment]

    return _apply("SuperExec polls", superexec_unchanged(flwr.__version__), patch)
