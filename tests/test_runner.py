"""fedsim.engines.runner: what ``fedsim run`` settles before it hands a run to its engine (the environment its
processes inherit, the run directory) and that those checks train nothing and draw nothing from the run's RNG.
Bad input's refusals are the corpus of tests/test_bad_inputs.py; runs themselves, every engine's tests."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from fedsim.config_file import parse_config
from fedsim.engines import runner
from tests.conftest import small_config


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment with none of the run's settings (each put back as it was after the test)."""
    for key in runner.RUN_ENV:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_the_run_environment_keeps_flower_and_ray_offline_and_a_users_own_settings(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("RAY_worker_niceness", "5")  # the user's own: Ray's workers niced
    runner.use_run_env()
    assert os.environ["RAY_worker_niceness"] == "5"
    assert {key: os.environ[key] for key in runner.OFFLINE_ENV} == runner.OFFLINE_ENV
    assert os.environ["FLWR_TELEMETRY_ENABLED"] == "0" and os.environ["RAY_USAGE_STATS_ENABLED"] == "0"


def test_planning_a_run_makes_its_directory_only_and_leaves_the_rng_as_it_was(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    cfg = parse_config(small_config(tmp_path))
    rng = torch.get_rng_state()
    experiment = runner.plan(cfg)
    assert torch.equal(torch.get_rng_state(), rng)  # the model built to check it came from a draw of its own
    run_dir = Path(experiment.config.output.run_dir or "")
    assert run_dir.parent == tmp_path / "runs" and re.fullmatch(r"t-\d{8}-\d{6}", run_dir.name)
    assert run_dir.is_dir() and not any(run_dir.iterdir())
    assert cfg.output.run_dir is None  # the caller's config is not changed


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path: Path) -> None:
    made = [runner.new_run_dir(tmp_path / "runs", "same") for _ in range(3)]
    assert len(set(made)) == 3 and all(p.is_dir() for p in made)
