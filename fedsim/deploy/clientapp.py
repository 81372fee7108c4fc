"""fedsim's Flower ClientApp as a SuperNode runs it: the core ClientApp (:mod:`fedsim.client.app`) with what
crossing processes needs around it.

A Message that came packed (:mod:`fedsim.deploy.packing`) is handled unpacked, and its reply goes back
packed. In a process that a SuperNode's fork server (:mod:`fedsim.deploy.forkserver`) forked, a run's
runtime that the Message made this process build (the server had not built it yet) is announced to the
server, which builds it too, so that the processes it forks next start with it.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedsim import wire
from fedsim.client import runtime
from fedsim.client.app import app as core_app
from fedsim.deploy.packing import packed_transport


class DeployedClientApp(ClientApp):
    """``core`` behind :func:`packed_transport`. ``announce``, which the fork server sets in a process it
    forked, is called with the run config of a runtime that a Message made this process build."""

    def __init__(self, core: ClientApp) -> None:
        super().__init__()
        self.core = core
        self.announce: Callable[[str], None] | None = None

    def __call__(self, message: Message, context: Context) -> Message:
        return packed_transport(message, context, self.handle)

    def handle(self, message: Message, context: Context) -> Message:
        """``core``'s reply, and the announcement of a runtime it built (a miss of the runtime cache)."""
        misses = runtime.prepare.cache_info().misses
        reply = self.core(message, context)
        if self.announce is not None and runtime.prepare.cache_info().misses > misses:
            self.announce(wire.run_config_json(message))
        return reply


app = DeployedClientApp(core_app)
