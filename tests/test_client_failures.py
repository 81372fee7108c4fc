"""The failure policy (train.on_client_failure) in process: a client that raises either stops the run
with a message naming round and client, or is left out and recorded in metrics.jsonl. The same
policy against killed SuperNode processes is in test_deploy.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.errors import TrainingError
from fedsim.server.reporter import ClientsLeftOut
from tests.conftest import small_config

FLAKY = {"name": "tests.plugins.flaky_client:Flaky", "fail_partition": 1, "fail_from": 2}


def flaky_config(tmp_path: Path, policy: str) -> dict:
    return small_config(tmp_path, strategy=FLAKY, train={"on_client_failure": policy}, eval={"every": 1})


def test_skip_aggregates_the_others_and_records_the_failed_client(tmp_path: Path) -> None:
    said = r"rounds that went on without clients that failed \(.*\): round 2: 1; round 3: 1; round 4: 1\Z"
    with pytest.warns(ClientsLeftOut, match=said):  # once, at the end of the run
        summary = run(parse_config(flaky_config(tmp_path, "skip")))
    lines = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [1, 2, 3, 4]
    assert "failed_clients" not in lines[0]
    assert lines[0]["client_acc"][1] is not None
    for m in lines[1:]:  # from round 2 on, partition 1 fails in training (its evaluation still works)
        assert m["failed_clients"] == {str(m["round"]): [1]}
        assert m["client_mean_acc"] == pytest.approx(sum(m["client_acc"]) / 4)
    assert summary["final_client_mean_acc"] == lines[-1]["client_mean_acc"]


def test_fail_stops_naming_round_and_client_and_keeps_what_was_written(tmp_path: Path) -> None:
    with pytest.raises(TrainingError) as err:
        run(parse_config(flaky_config(tmp_path, "fail")))
    message = str(err.value)  # the round, the client and its error, the policy (wording: the corpus)
    assert re.match(r"round 2\b.*\btraining\b.*\bclient 1\b", message), message
    assert "RuntimeError: injected failure of partition 1 in round 2" in message, message
    assert "train.on_client_failure" in message and "\n" not in message  # the one line an error is
    (run_dir,) = (tmp_path / "runs").iterdir()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [1]
    assert not (run_dir / "summary.json").exists()


def test_skip_stops_when_no_client_is_left_to_train(tmp_path: Path) -> None:
    # the one client fails from round 2 on: skipping it leaves nothing to aggregate, which is not a result
    alone = {**FLAKY, "fail_partition": 0}
    cfg = small_config(tmp_path, strategy=alone, train={"on_client_failure": "skip", "num_clients": 1},
                       eval={"every": 1})  # fmt: skip
    cfg["partition"] = {"name": "iid"}
    with pytest.raises(TrainingError, match=r"^round 2\b.*\btraining\b"):  # wording: the corpus
        run(parse_config(cfg))
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not (run_dir / "summary.json").exists()


@pytest.mark.parametrize("engine", ["inline", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_client_that_fails_after_its_state_changed_keeps_the_state_the_server_knows(
    tmp_path: Path, engine: str
) -> None:
    # SCAFFOLD's client 1 fails in round 2 after end_round changed its c_i: the server never saw that Δc_i, so
    # the run must go on exactly as if the client had failed before training (c stays the mean of the c_i)
    def run_failing(when: str) -> list[dict]:
        strategy = {"name": "tests.plugins.flaky_scaffold:FlakyScaffold", "fail_round": 2, "when": when}
        cfg = small_config(
            tmp_path / when, strategy=strategy, train={"on_client_failure": "skip"}, eval={"every": 1},
            simulation={"backend": engine, "threads": 1},
        )  # fmt: skip
        with pytest.warns(ClientsLeftOut, match=r"round 2: 1\Z"):
            summary = run(parse_config(cfg))
        return [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]

    after, before = run_failing("after"), run_failing("before")
    measured = [{k: v for k, v in m.items() if k not in ("time_s", "rss_mb")} for m in after]
    assert measured == [{k: v for k, v in m.items() if k not in ("time_s", "rss_mb")} for m in before]
    assert after[1]["failed_clients"] == {"2": [1]} and len(after) == 4
