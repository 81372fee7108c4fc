"""The run config's schemas (fedsim.config): the sections, their defaults and the forms they still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.config import DeprecatedConfig
from fedsim.config_file import load_config
from tests.conftest import run_cli, small_config, write_config


def test_deprecated_args_and_norm_args_read_as_the_new_form_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = small_config(tmp_path, name="old"), small_config(tmp_path, name="old")
    old["model"] = {"name": "mlp", "norm": "gn", "norm_args": {"groups": 4}, "args": {"hidden": [64]}}
    new["model"] = {"name": "mlp", "norm": {"name": "gn", "groups": 4}, "hidden": [64]}
    with pytest.warns(DeprecatedConfig) as caught:
        old_cfg = load_config(write_config(tmp_path, old, "old.yaml"))
    assert [str(w.message) for w in caught] == [
        "model.args is deprecated and will be removed: write model: {name: mlp, hidden: [64]}",
        "model.norm_args is deprecated and will be removed: write model.norm: {name: gn, groups: 4}",
    ]
    assert old_cfg.to_json() == load_config(write_config(tmp_path, new, "new.yaml")).to_json()
    # the command line shows each as one plain line, then runs
    old["train"]["rounds"] = 1
    code, err = run_cli(capsys, write_config(tmp_path, old, "old.yaml"))
    assert code == 0 and err.splitlines()[0].startswith("fedsim: warning: model.args is deprecated")
    # an option given both ways is an error, not a silent choice
    both = small_config(tmp_path)
    both["model"] = {"name": "mlp", "hidden": [8], "args": {"hidden": [64]}}
    code, err = run_cli(capsys, write_config(tmp_path, both, "both.yaml"))
    assert code == 2 and len(err.splitlines()) == 1 and "model.args" in err and "hidden" in err, err
