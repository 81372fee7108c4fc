"""A test plugin strategy: SCAFFOLD whose client ``fail_partition`` raises in round ``fail_round``, before it
trains (``when: before``) or after its hooks changed its state (``when: after``, in ``reply_arrays``).
Referenced from YAML as ``tests.plugins.flaky_scaffold:FlakyScaffold``."""

from __future__ import annotations

from typing import Literal

from flwr.app import ArrayRecord, RecordDict
from pydantic import Field

from fedsim.models import FedsimModel
from fedsim.strategies import RoundInfo
from fedsim.strategies.scaffold import ScaffoldClient, ScaffoldSpec


class FlakyScaffoldClient(ScaffoldClient):
    def begin_round(self, model: FedsimModel, content: RecordDict, state: RecordDict, info: RoundInfo) -> None:
        self.failing = (info.partition_id, info.server_round) == (self.params.fail_partition, self.params.fail_round)
        if self.failing and self.params.when == "before":
            raise RuntimeError(f"injected failure of partition {info.partition_id} before training")
        super().begin_round(model, content, state, info)

    def reply_arrays(self, model: FedsimModel, state: RecordDict) -> ArrayRecord:
        if self.failing and self.params.when == "after":
            raise RuntimeError("injected failure after the client's state changed")
        return super().reply_arrays(model, state)


class FlakyScaffold(ScaffoldSpec):
    """SCAFFOLD with one client that fails once, before or after its state changed (test plugin)."""

    Client = FlakyScaffoldClient

    class Params(ScaffoldSpec.Params):
        fail_partition: int = Field(1, ge=0)
        fail_round: int = Field(2, ge=1)
        when: Literal["before", "after"] = "after"
