"""Every built-in strategy whose Messages are not FedAvg's (tests/strategy_rows.py: records of its own, or replies that
hold part of the model) gives the numbers of the inline engine under a Ray pool and Flower's simulation runtime: its
Message records go over each transport and its client state lives in each runtime's node contexts (Ray actors,
Flower's node states). Two clients of three train each round, so a client's state waits rounds between uses; one
strategy's run scores the generic personalisation too (eval.personal: fine-tuned on each client, under each
runtime). The other strategies send FedAvg's Messages, whose engines agree (tests/test_engines.py), and differ only
in the server's or the client's arithmetic, which is the same code under every engine.

Under ``fedsim deploy`` (a SuperLink and a SuperNode per client), the rows whose deployed work differs from the
others': CCVR's message kind of its own, FedRoD's personal heads kept by the SuperNodes and scored there, and FedNova's
own record beside the generic personalisation. Every row's Messages and client state go over Flower's wire format as
a deployment carries them in the quick suite (tests/test_wire_format.py), and SCAFFOLD's c_i over a deployment killed
and resumed is tests/test_deploy.py's: a deployment of each row would add the start of its ~13 processes (over a
minute on 2 cores) and what fedsim deploy does the same for every strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedsim.config_file import parse_config
from fedsim.deploy.launcher import deploy
from fedsim.engines.runner import run
from tests import strategy_rows
from tests.conftest import small_config
from tests.test_deploy import assert_same_numbers
from tests.test_resume import metrics

TRAIN = {"rounds": 3, "num_clients": 3, "clients_per_round": 2}
# the generic personalisation too (the classifier fine-tuned for a few steps on each client, every 2 rounds and
# the last: rounds 2 and 3), on a strategy of the table whose own hooks leave fine-tuning generic
FINE_TUNED = {"fednova": {"personal": {"steps": 3, "params": "classifier", "every": 2}}}


OWN_MESSAGES = [name for name in strategy_rows.ROWS if strategy_rows.has_own_messages(name)]
DEPLOYED = ["ccvr", "fedrod", "fednova"]


def row_config(tmp_path: Path, name: str, where: str, **more: Any) -> Any:
    """The row's run of 3 rounds, 2 clients of 3 a round, evaluated every round, under ``where``."""
    row = strategy_rows.sections(name)
    evaluation = {**row.get("eval", {}), "every": 1, **FINE_TUNED.get(name, {})}
    sections: dict[str, Any] = {**row, "train": TRAIN, "eval": evaluation}
    return parse_config(small_config(tmp_path / where, **sections, **more))


def inline_metrics(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    inline = metrics(Path(run(row_config(tmp_path, name, "inline"))["run_dir"]))
    assert [m["round"] for m in inline] == [1, 2, 3]
    if name in FINE_TUNED:
        assert [m["round"] for m in inline if "personal_acc" in m] == [2, 3]  # every 2 rounds, and the last
    return inline


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("name", OWN_MESSAGES)
def test_every_strategy_gives_the_inline_numbers_under_ray_and_flower(tmp_path: Path, name: str) -> None:
    inline = inline_metrics(tmp_path, name)
    pool = row_config(tmp_path, name, "pool", simulation={"backend": "ray", "client_resources": {"num_cpus": 1}})
    assert metrics(Path(run(pool)["run_dir"])) == inline  # Ray actors: bit for bit
    flower = row_config(tmp_path, name, "flower", engine="flower", simulation={"client_resources": {"num_cpus": 1}})
    assert metrics(Path(run(flower)["run_dir"])) == inline  # Flower's runtime: bit for bit


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("name", DEPLOYED)
def test_the_strategies_that_deploy_differently_give_the_inline_numbers_under_deploy(tmp_path: Path, name: str) -> None:
    inline = inline_metrics(tmp_path, name)
    deployed = metrics(Path(deploy(row_config(tmp_path, name, "deploy"))["run_dir"]))
    assert_same_numbers(deployed, inline)  # the SuperNodes' threads: tests/test_deploy.py
    for d, i in zip(deployed, inline, strict=True):  # personalised scores, in the rounds that have them
        assert ("client_personal_acc" in d) == ("client_personal_acc" in i)
        assert d.get("client_personal_acc") == pytest.approx(i.get("client_personal_acc"), abs=1e-6)
    personal = "personal" in {**strategy_rows.ROWS[name].get("eval", {}), **FINE_TUNED.get(name, {})}
    assert any("client_personal_acc" in d for d in deployed) == personal  # scored on the SuperNodes


def test_the_deployed_rows_are_rows_with_messages_of_their_own() -> None:
    assert set(DEPLOYED) <= set(OWN_MESSAGES)
