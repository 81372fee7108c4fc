"""SCAFFOLD whose ServerApp, deployed, SIGKILLs its SuperLink (unless ``kill_superlink`` is false) and then
itself as round ``kill_round`` starts, unless the run was resumed (test plugin for resuming a deployed run: a
kill at an exact round, after the checkpoint of the round before, with no watcher racing the run):
``tests.plugins.superlink_killer:KillSuperLink``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from pydantic import Field

from fedsim.strategies.scaffold import ScaffoldServer, ScaffoldSpec
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup


def superlink_pid() -> int:
    """The ``flower-superlink`` process this ServerApp runs under (its SuperExec's parent)."""
    pid = os.getppid()
    while pid > 1:
        if b"flower-superlink" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
    raise RuntimeError("this ServerApp runs under no SuperLink: the test plugin kills only a deployed run")


class KillingServer(ScaffoldServer):
    def __init__(self, params: KillSuperLink.Params, setup: ServerSetup) -> None:
        super().__init__(params.eta_g, params.weighting, setup, **EVERY_NODE)
        self.kill_round, self.kill_superlink, self.resumed = params.kill_round, params.kill_superlink, False

    def load_server_state(self, state: ArrayRecord) -> None:
        self.resumed = True  # called on a resumed run only
        super().load_server_state(state)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if server_round == self.kill_round and not self.resumed:
            if self.kill_superlink:
                os.kill(superlink_pid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().configure_train(server_round, arrays, config, grid)


class KillSuperLink(ScaffoldSpec):
    """SCAFFOLD whose deployed ServerApp kills its SuperLink and itself in one round (test plugin)."""

    class Params(ScaffoldSpec.Params):
        kill_round: int = Field(ge=1)
        kill_superlink: bool = True

    def server(self, setup: ServerSetup) -> KillingServer:
        return KillingServer(self.params, setup)
