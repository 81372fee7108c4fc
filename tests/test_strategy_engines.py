"""Every built-in strategy whose Messages are not FedAvg's (tests/strategy_rows.py: records of its own, or replies that
hold part of the model) gives the numbers of the inline engine under a Ray pool, Flower's simulation runtime and
``fedsim deploy`` (a SuperLink and a SuperNode per client): its Message records go over each transport and its
client state lives in each runtime's node contexts (Ray actors, Flower's node states, SuperNode processes). Two
clients of three train each round, so a client's state waits rounds between uses. The other strategies send FedAvg's
Messages, whose engines agree (tests/test_engines.py), and differ only in the server's or the client's arithmetic,
which is the same code under every engine."""

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


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("name", [name for name in strategy_rows.ROWS if strategy_rows.has_own_messages(name)])
def test_every_strategy_gives_the_inline_numbers_under_ray_flower_and_deploy(tmp_path: Path, name: str) -> None:
    row = strategy_rows.sections(name)
    sections: dict[str, Any] = {**row, "train": TRAIN, "eval": {**row.get("eval", {}), "every": 1}}

    def config(where: str, **more: Any) -> Any:
        return parse_config(small_config(tmp_path / where, **sections, **more))

    inline = metrics(Path(run(config("inline"))["run_dir"]))
    assert [m["round"] for m in inline] == [1, 2, 3]
    pool = config("pool", simulation={"backend": "ray", "client_resources": {"num_cpus": 1}})
    assert metrics(Path(run(pool)["run_dir"])) == inline  # Ray actors: bit for bit
    flower = config("flower", engine="flower", simulation={"client_resources": {"num_cpus": 1}})
    assert metrics(Path(run(flower)["run_dir"])) == inline  # Flower's runtime: bit for bit
    deployed = metrics(Path(deploy(config("deploy"))["run_dir"]))
    assert_same_numbers(deployed, inline)  # the SuperNodes' threads: tests/test_deploy.py
    for d, i in zip(deployed, inline, strict=True):  # personalised scores, where the row turns them on (FedRoD)
        assert d.get("client_personal_acc") == pytest.approx(i.get("client_personal_acc"), abs=1e-6)
