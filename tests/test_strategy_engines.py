"""Every built-in strategy whose Messages are not FedAvg's (tests/strategy_rows.py: records of its own, or replies that
hold part of the model) gives the numbers of the inline engine under a Ray pool, Flower's simulation runtime and
``fedsim deploy`` (a SuperLink and a SuperNode per client): its Message records go over each transport and its client
state lives in each runtime's node contexts (Ray actors, Flower's node states, SuperNode processes). Two clients of
three train each round, so a client's state waits rounds between uses; one strategy's run scores the generic
personalisation too (eval.personal: fine-tuned on each client, under each runtime). The other strategies send
FedAvg's Messages, whose engines agree (tests/test_engines.py), and differ only in the server's or the client's
arithmetic, which is the same code under every engine."""

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


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("name", [name for name in strategy_rows.ROWS if strategy_rows.has_own_messages(name)])
def test_every_strategy_gives_the_inline_numbers_under_ray_flower_and_deploy(tmp_path: Path, name: str) -> None:
    row = strategy_rows.sections(name)
    evaluation = {**row.get("eval", {}), "every": 1, **FINE_TUNED.get(name, {})}
    sections: dict[str, Any] = {**row, "train": TRAIN, "eval": evaluation}

    def config(where: str, **more: Any) -> Any:
        return parse_config(small_config(tmp_path / where, **sections, **more))

    inline = metrics(Path(run(config("inline"))["run_dir"]))
    assert [m["round"] for m in inline] == [1, 2, 3]
    if name in FINE_TUNED:
        assert [m["round"] for m in inline if "personal_acc" in m] == [2, 3]  # every 2 rounds, and the last
    pool = config("pool", simulation={"backend": "ray", "client_resources": {"num_cpus": 1}})
    assert metrics(Path(run(pool)["run_dir"])) == inline  # Ray actors: bit for bit
    flower = config("flower", engine="flower", simulation={"client_resources": {"num_cpus": 1}})
    assert metrics(Path(run(flower)["run_dir"])) == inline  # Flower's runtime: bit for bit
    deployed = metrics(Path(deploy(config("deploy"))["run_dir"]))
    assert_same_numbers(deployed, inline)  # the SuperNodes' threads: tests/test_deploy.py
    for d, i in zip(deployed, inline, strict=True):  # personalised scores, in the rounds that have them
        assert ("client_personal_acc" in d) == ("client_personal_acc" in i)
        assert d.get("client_personal_acc") == pytest.approx(i.get("client_personal_acc"), abs=1e-6)
