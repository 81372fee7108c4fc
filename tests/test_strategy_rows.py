"""Every built-in strategy has its row in tests/strategy_rows.py, so the end-to-end, vmapped-clients and resume
tests cover it; and the rows say which strategies keep state."""

from __future__ import annotations

from fedsim.strategies import STRATEGIES
from tests import strategy_rows


def test_every_builtin_strategy_has_a_row() -> None:
    assert sorted(strategy_rows.ROWS) == sorted(entry.name for entry in STRATEGIES.builtins())


def test_the_rows_tell_stateful_strategies_from_stateless_ones() -> None:
    # SCAFFOLD's c_i and FedBN's tensors live on the clients; Yogi's m and v, FedAvgM's momentum on the server
    assert [n for n in strategy_rows.ROWS if strategy_rows.keeps_client_state(n)] == ["scaffold", "fedbn"]
    assert {"scaffold", "fedyogi", "fedavgm", "fedadam"} <= set(strategy_rows.stateful())
    assert not {"fedavg", "fedprox", "fedlc", "fedrs", "feddecorr", "fednova"} & set(strategy_rows.stateful())
