"""Engines deliver the same Messages to the same ClientApp: same config + seed, same metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from tests.conftest import small_config


def metrics_of(tmp_path: Path, name: str, **sections: Any) -> list[dict[str, Any]]:
    cfg = parse_config(small_config(tmp_path, name=name, **sections))
    summary = run(cfg)
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    wall_clock = ("time_s", "rss_mb")  # facts about the machine, not results
    return [{k: v for k, v in json.loads(line).items() if k not in wall_clock} for line in lines]


def test_same_seed_same_metrics_other_seed_other_metrics(tmp_path: Path) -> None:
    first = metrics_of(tmp_path, "a")
    second = metrics_of(tmp_path, "b")
    other = metrics_of(tmp_path, "c", seed=1)
    assert [m["round"] for m in first] == [2, 4]
    assert first == second
    assert first[-1]["client_mean_acc"] != other[-1]["client_mean_acc"]
    assert first[-1]["train_loss"] != other[-1]["train_loss"]


def test_partial_participation_is_seeded_and_changes_training(tmp_path: Path) -> None:
    full = metrics_of(tmp_path, "full")
    part1 = metrics_of(tmp_path, "p1", train={"clients_per_round": 2})
    part2 = metrics_of(tmp_path, "p2", train={"clients_per_round": 2})
    assert part1 == part2
    assert part1[-1]["train_loss"] != full[-1]["train_loss"]
    assert len(part1[-1]["client_acc"]) == 4  # evaluation still covers every client


@pytest.mark.slow
@pytest.mark.long
def test_inline_ray_pool_and_flower_runtime_agree_at_the_same_cpu_priority(tmp_path: Path) -> None:
    """Same numbers from every engine; and Ray's workers run at this process's niceness, not Ray's
    default of 15 more, which starved them beside any other busy process."""
    niceness = {name: tmp_path / f"nice-{name}" for name in ("inline", "pool", "flower")}

    def recorded(name: str) -> dict[str, Any]:
        niceness[name].mkdir()
        return {"strategy": {"name": "tests.plugins.niceness:Niceness", "record_dir": str(niceness[name])}}

    inline = metrics_of(tmp_path, "inline", **recorded("inline"))
    pool = metrics_of(
        tmp_path, "pool", simulation={"backend": "ray", "client_resources": {"num_cpus": 1}}, **recorded("pool")
    )
    flower = metrics_of(
        tmp_path, "flower", engine="flower", simulation={"client_resources": {"num_cpus": 1}}, **recorded("flower")
    )
    assert inline == pool == flower
    assert inline[-1]["client_mean_acc"] > 0.5  # it learned: 10 classes, chance is 0.1
    here = (str(os.getpid()), str(os.nice(0)))
    assert {(f.name, f.read_text()) for f in niceness["inline"].iterdir()} == {here}
    for name in ("pool", "flower"):  # other processes, this one's niceness
        workers = {f.name: f.read_text() for f in niceness[name].iterdir()}
        assert workers and here[0] not in workers and set(workers.values()) == {here[1]}, (name, workers)


def test_client_state_beyond_the_budget_waits_on_disk_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCAFFOLD's c_i of every client in the driver's memory would grow with the federation: beyond
    simulation.state_memory_mb the least recently used states go to disk, memory holds the budget and
    the state being served, never more (not even when a checkpoint asks every node for its state), and
    the numbers stay the same."""
    from fedsim.engines.states import NodeStates, state_bytes

    section = {
        "strategy": {"name": "scaffold"},
        "train": {"clients_per_round": 2},
        "output": {"checkpoint_every": 2},  # each checkpoint: a message to every node, its state loaded
    }
    in_memory = metrics_of(tmp_path, "memory", **section)
    c_i = sum(p.numel() * 4 for p in torch.nn.Linear(784, 64, bias=False).parameters())  # the MLP's largest layer
    budget_mb = 1.5 * c_i / 2**20  # room for one client's c_i (the whole MLP's: a few % more than c_i)
    in_memory_after_load: list[int] = []
    one_state: list[int] = []
    spilled: list[int] = []
    load, settle = NodeStates.load, NodeStates.settle

    def loading(self: NodeStates, node: int) -> None:
        load(self, node)
        in_memory_after_load.append(sum(state_bytes(c) for c in self.contexts.values()))
        one_state.append(state_bytes(self.contexts[node]))

    def settling(self: NodeStates, nodes: list[int]) -> None:
        settle(self, nodes)
        spilled.append(len(self.spilled))

    monkeypatch.setattr(NodeStates, "load", loading)
    monkeypatch.setattr(NodeStates, "settle", settling)
    on_disk = metrics_of(tmp_path, "disk", simulation={"state_memory_mb": budget_mb}, **section)
    assert on_disk == in_memory
    assert max(spilled) >= 2  # most clients' c_i waited on disk ...
    # ... and memory held at most the budget plus the one state being served
    assert max(in_memory_after_load) <= budget_mb * 2**20 + max(one_state)
