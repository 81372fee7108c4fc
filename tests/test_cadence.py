"""When a run evaluates, and which evaluations score the personalised models (fedsim/cadence.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.cadence import EvalCadence, personalises
from fedsim.config_file import parse_config
from tests.conftest import small_config


def test_a_run_evaluates_every_k_rounds_and_after_the_last() -> None:
    cadence = EvalCadence(every=3, num_rounds=10)
    assert [r for r in range(1, 11) if cadence.is_eval_round(r)] == [3, 6, 9, 10]
    assert [r for r in range(1, 7) if EvalCadence(every=1, num_rounds=6).is_eval_round(r)] == [1, 2, 3, 4, 5, 6]
    assert [r for r in range(1, 5) if EvalCadence(every=50, num_rounds=4).is_eval_round(r)] == [4]


@pytest.mark.parametrize(
    ("personal", "rounds"),
    [
        ({}, []),  # off
        ({"steps": 0}, [2, 4, 6, 7]),  # at every evaluation
        ({"steps": 5, "every": 4}, [4, 7]),  # every 4th round and the last
        ({"steps": 5, "every": 100}, [7]),  # beyond the run: the last round only
    ],
)
def test_personalised_rounds_are_those_evaluations_eval_personal_names(personal: dict, rounds: list[int]) -> None:
    cfg = parse_config(small_config(Path("/nonexistent"), train={"rounds": 7}, eval={"every": 2, "personal": personal}))
    assert [r for r in range(1, 8) if personalises(cfg, r)] == rounds
    evaluated = EvalCadence(cfg.eval.every, cfg.train.rounds)
    assert all(evaluated.is_eval_round(r) for r in rounds)  # never a round the run does not evaluate
