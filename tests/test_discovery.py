"""Which node holds which partition, on which data (fedsim/server/discovery.py), against a stand-in grid: the map,
and the refusals before round 1 (a node that is not fedsim's, a partition claimed twice or missing, other data).
The same over a real SuperLink: tests/test_deploy.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Error, Message, MetricRecord, RecordDict

from fedsim import wire
from fedsim.config_file import parse_config
from fedsim.engines.local import identify_as_server
from fedsim.errors import DataError, FedsimError, ProtocolError
from fedsim.server.discovery import ShiftedIds, discover_partitions, invert
from tests.conftest import small_config

DATA = "d" * 64
CFG = parse_config(small_config(Path("/nonexistent")))  # train.num_clients = 4


class Grid:
    """Nodes 10, 11, ... each answering the partition query with ``answers[node]``: a partition id and a data
    fingerprint, or an error reason."""

    def __init__(self, answers: dict[int, Any]) -> None:
        self.answers = answers
        identify_as_server(1)

    def get_node_ids(self) -> list[int]:
        return list(self.answers)

    def send_and_receive(self, messages: list[Message], timeout: float | None = None) -> list[Message]:
        replies = []
        for m in messages:
            answer = self.answers[m.metadata.dst_node_id]
            if isinstance(answer, str):
                replies.append(Message(Error(code=0, reason=answer), reply_to=m))
                continue
            pid, data = answer
            content = {wire.METRICS: MetricRecord({wire.PARTITION_ID: pid}),
                       wire.CONFIG: ConfigRecord({wire.DATA_SHA256: data})}  # fmt: skip
            replies.append(Message(RecordDict(content), reply_to=m))
        return replies


def test_every_partition_maps_to_the_node_that_holds_it() -> None:
    grid = Grid({10: (2, DATA), 11: (0, DATA), 12: (3, DATA), 13: (1, DATA)})
    assert discover_partitions(grid, CFG, DATA) == {2: 10, 0: 11, 3: 12, 1: 13}


@pytest.mark.parametrize(
    ("answers", "error", "said"),
    [
        ({10: (0, DATA), 11: (0, DATA), 12: (2, DATA), 13: (3, DATA)}, FedsimError, "two nodes claim partition 0"),
        ({10: (0, DATA), 11: (1, DATA), 12: (2, DATA), 13: (7, DATA)}, FedsimError,
         r"nodes hold partitions \[0, 1, 2, 7\], expected 0\.\.3 \(train\.num_clients\)"),
        ({10: (0, DATA), 11: (1, DATA), 12: (2, "e" * 64), 13: (3, DATA)}, DataError,
         r"node 12 \(partition 2\): data\.root .* holds other data than the server's"),
        ({10: (0, DATA), 11: "No query function registered for query.partition", 12: (2, DATA), 13: (3, DATA)},
         ProtocolError, "node 11 does not run fedsim's ClientApp"),
        ({10: (0, DATA), 11: "ValueError: no data", 12: (2, DATA), 13: (3, DATA)}, FedsimError,
         "node 11 failed the partition query: ValueError: no data"),
    ],  # fmt: skip
    ids=["claimed-twice", "missing", "other-data", "not-fedsim", "failed"],
)
def test_a_federation_that_is_not_the_runs_is_refused_before_round_1(
    answers: dict[int, Any], error: type[Exception], said: str
) -> None:
    with pytest.raises(error, match=said):
        discover_partitions(Grid(answers), CFG, DATA)


def test_too_few_nodes_connected_within_the_wait_is_an_error() -> None:
    with pytest.raises(FedsimError, match=r"^only 2 of 4 client nodes connected in 1 s$"):
        discover_partitions(Grid({10: (0, DATA), 11: (1, DATA)}), CFG, DATA, wait_s=1.0)


def test_shifted_ids_are_a_mapping_held_in_two_numbers_and_invert() -> None:
    ids = ShiftedIds(start=0, count=1_000_000, shift=1)
    assert (ids[0], ids[999_999], len(ids)) == (1, 1_000_000, 1_000_000)
    with pytest.raises(KeyError):
        ids[1_000_000]
    back = invert(ids)
    assert isinstance(back, ShiftedIds) and back[1] == 0 and back[1_000_000] == 999_999
    assert list(ShiftedIds(5, 3, 10)) == [5, 6, 7] and dict(ShiftedIds(5, 3, 10)) == {5: 15, 6: 16, 7: 17}
    assert invert({0: 10, 1: 11}) == {10: 0, 11: 1}
