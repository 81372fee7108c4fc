"""fedsim.deploy.serverapp: the ServerApp Flower's own runtimes run (a SuperLink, ``flwr run``) reads its run
config inline or from the app bundle, and, where nobody sees its traceback, leaves a failure's reason in the run
directory. Deployed runs through it are tests/test_deploy.py's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedsim import wire
from fedsim.config_file import load_config, parse_config
from fedsim.deploy import serverapp
from fedsim.errors import FedsimError
from tests.conftest import small_config, write_config


def context(**run_config: object) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)  # type: ignore[arg-type]


def test_a_config_path_is_read_as_given_else_from_the_app_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "configs").mkdir(parents=True)
    (bundle / "configs" / "run.yaml").write_text("name: x\n")
    monkeypatch.setattr(sys, "path", ["", str(tmp_path / "elsewhere"), str(bundle)])
    assert serverapp.app_file("configs/run.yaml") == bundle / "configs" / "run.yaml"
    assert serverapp.app_file(str(bundle / "configs" / "run.yaml")) == bundle / "configs" / "run.yaml"
    assert serverapp.app_file("configs/none.yaml") == Path("configs/none.yaml")  # its reader says it is missing
    assert serverapp.app_file("/abs/run.yaml") == Path("/abs/run.yaml")  # never looked for in the bundle


def test_the_run_config_holds_the_config_inline_or_as_a_yaml_path(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path))
    assert serverapp.config_from_context(context(**{wire.RUN_CONFIG: cfg.to_json()})) == cfg
    path = write_config(tmp_path, small_config(tmp_path))
    assert serverapp.config_from_context(context(config=str(path))) == load_config(path)
    with pytest.raises(FedsimError) as err:
        serverapp.config_from_context(context(other="x"))
    assert f"'{wire.RUN_CONFIG}'" in str(err.value) and "'config'" in str(err.value)


def test_a_serverapp_that_cannot_go_on_leaves_its_reason_in_the_run_directory(tmp_path: Path) -> None:
    """Under a SuperLink nobody sees the ServerApp's traceback: a resume with nothing to resume from is raised,
    and its one line is error.txt, where fedsim deploy reads it."""
    cfg = parse_config(small_config(tmp_path))
    cfg.output.run_dir = str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    with pytest.raises(FedsimError) as err:
        serverapp.main(object(), context(**{wire.RUN_CONFIG: cfg.to_json(), wire.RESUME: True}))  # type: ignore[arg-type]
    assert (tmp_path / "run" / "error.txt").read_text().strip() == str(err.value)
