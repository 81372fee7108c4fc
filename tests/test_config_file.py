"""Reading a config file (fedsim.config_file): YAML, --set overrides, and every problem on one line naming the
field and what is allowed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedsim.config import RunConfig
from fedsim.config_file import apply_overrides, check_keys_once, load_config, parse_yaml, section_keys
from fedsim.errors import ConfigError
from tests.conftest import run_cli, small_config, write_config


def test_overrides_are_applied_and_parsed_as_yaml(tmp_path: Path) -> None:
    path = write_config(tmp_path, small_config(tmp_path))
    cfg = load_config(path, ["train.rounds=5", "model.norm=fn", "model.hidden=[8, 8]", "seed=3"])
    assert cfg.train.rounds == 5 and cfg.model.norm.name == "fn" and cfg.model.options == {"hidden": [8, 8]}
    assert cfg.seed == 3
    # an option of a plugin given by its name alone: the name becomes {name: <it>}
    cfg = load_config(path, ["model.norm=gn", "model.norm.groups=4"])
    assert cfg.model.norm.name == "gn" and cfg.model.norm.options == {"groups": 4}


def test_yaml_merge_keys_merge_and_the_mapping_own_keys_win(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``<<: *base`` (YAML's merge key) merges an anchored mapping; keys given beside it replace the merged ones.
    A key given twice is still refused, in the mapping and in a merged one."""
    anchored = parse_yaml("base: &b {lr: 0.1, rounds: 2}\ntrain:\n  <<: *b\n  lr: 0.3\n", "a sweep's cells")
    assert anchored == {"base": {"lr": 0.1, "rounds": 2}, "train": {"lr": 0.3, "rounds": 2}}
    base = small_config(tmp_path)
    train = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in base.pop("train").items() if k != "lr")
    del base["eval"]
    path = write_config(tmp_path, base, "merge.yaml")
    text = f"{path.read_text()}train:\n{train}  lr: 0.05\neval:\n  every: 1\n"
    path.write_text(text + "diagnostics:\n  <<: [{features: true}, {probe_size: 8}]\n  probe_size: 16\n")
    cfg = load_config(path)
    assert (cfg.train.lr, cfg.train.rounds, cfg.diagnostics.features, cfg.diagnostics.probe_size) == (0.05, 4, True, 16)
    path.write_text(text.replace("eval:\n  every: 1\n", "eval:\n  every: 1\n  <<: {every: 2, every: 3}\n"))
    code, err = run_cli(capsys, path)  # the file, the key and its line (wording: tests/test_bad_inputs.py)
    assert code == 2 and err.startswith(f"fedsim: error: {path}: ") and err.count("\n") == 1, err
    assert "'every'" in err and f"line {len(text.splitlines()) + 1}" in err, err
    path.write_text(text.replace("eval:\n  every: 1\n", "eval:\n  <<: {batch_size: 64}\n  every: 1\n  every: 2\n"))
    code, err = run_cli(capsys, path)
    assert code == 2 and err.startswith(f"fedsim: error: {path}: ") and "'every'" in err, err


@pytest.mark.parametrize(
    ("yaml_text", "named"),
    [
        ("seed: !!python/object/apply:os.system ['touch {tmp}/pwned']\n",
         "'tag:yaml.org,2002:python/object/apply:os.system' at line 1"),
        ("seed: !custom 1\n", "'!custom' at line 1"),
        ("train:\n  <<: 5\n", "at line 2"),
    ],
)  # fmt: skip
def test_yaml_tags_are_refused_naming_the_tag_and_what_a_config_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, named: str
) -> None:
    """The file, the tag and its line, and the ``<<`` merges a config may hold (wording: tests/test_bad_inputs.py)."""
    path = tmp_path / "tagged.yaml"
    path.write_text(yaml_text.replace("{tmp}", str(tmp_path)))
    code, err = run_cli(capsys, path)
    assert code == 2 and err.startswith(f"fedsim: error: {path}: ") and err.count("\n") == 1, err
    assert named in err and "<<" in err, err
    assert not (tmp_path / "pwned").exists()


SECTIONS = "name, seed, engine, data, partition, model, strategy, train, eval, simulation, output, diagnostics, deploy"


@pytest.mark.parametrize(
    ("override", "where", "valid"),
    [
        ("foo=1", "foo", SECTIONS),
        ("simulation.client_resources.foo=1", "simulation.client_resources.foo", "num_cpus, num_gpus"),
        ("deploy.certificates={ca: a, cert: b, key: c, foo: 1}", "deploy.certificates.foo", "ca, cert, key"),
        ("eval.foo=1", "eval.foo", "every, batch_size, global_test, clients, personal"),
    ],
)
def test_an_unknown_key_at_any_level_lists_the_valid_keys_of_its_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, where: str, valid: str
) -> None:
    path = write_config(tmp_path, small_config(tmp_path))
    code, err = run_cli(capsys, path, override)  # the key, then each valid key (wording: tests/test_bad_inputs.py)
    assert code == 2 and err.startswith(f"fedsim: error: {where}: ") and err.count("\n") == 1, err
    assert re.search(r"\b" + r"\b.*\b".join(valid.split(", ")) + r"\b", err.partition(where)[2]), err


@pytest.mark.parametrize(
    ("sections", "overrides", "problems"),
    [
        (  # the file's errors and --set's together, each with its field, value and what is allowed
            {"train": {"rounds": 0, "lr": -1, "bogus": 3}},
            ["eval.every=-3"],
            [
                ("train.rounds", "(got 0)"),
                ("train.lr", "(got -1)"),
                ("train.bogus", "(got 3)", "local_steps"),
                ("eval.every", "(got -3)"),
            ],
        ),
        (  # a plugin's options, checked once the sections are valid
            {"strategy": {"name": "fedyogi", "eta": -1, "beta_1": 3}},
            ["strategy.v0=x"],
            [
                ("strategy.eta = -1", "'fedyogi'"),
                ("strategy.beta_1 = 3", "'fedyogi'"),
                ("strategy.v0 = 'x'", "'fedyogi'", "'tau^2'"),
            ],
        ),
    ],
    ids=["sections", "plugin-options"],
)
def test_several_errors_are_one_line_naming_every_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sections: dict,
    overrides: list[str],
    problems: list[tuple[str, ...]],
) -> None:
    """Every problem at once, numbered (a problem may hold a semicolon of its own), on the one line an error is,
    not pydantic's line per error; each names its field, value and what is allowed (the wording:
    tests/test_bad_inputs.py)."""
    code, err = run_cli(capsys, write_config(tmp_path, small_config(tmp_path, **sections)), *overrides)
    assert code == 2 and err.startswith(f"fedsim: error: {len(problems)} ") and err.count("\n") == 1, err
    numbered = re.split(r"\((\d+)\) ", err)[1:]  # number, problem, number, problem, ...
    assert numbered[::2] == [str(n) for n in range(1, len(problems) + 1)], err
    for said, (field, *named) in zip(numbered[1::2], problems, strict=True):
        assert said.startswith(field) and all(n in said for n in named), err


def test_overrides_set_dotted_keys_in_sections_made_as_needed() -> None:
    """A value parsed as YAML, a section made where there is none, a plugin given by its name alone made
    ``{name: <it>}``; a key inside a value that is not a section is refused naming both."""
    raw = apply_overrides({"model": "cnn"}, ["model.norm=gn", "train.lr=1e-3"])
    assert raw == {"model": {"name": "cnn", "norm": "gn"}, "train": {"lr": 0.001}}
    with pytest.raises(ConfigError, match=r"^--set seed\.x\b.*'seed'"):  # wording: tests/test_bad_inputs.py
        apply_overrides({"seed": 1}, ["seed.x=1"])


def test_a_key_given_twice_in_one_set_list_is_refused_with_both_values() -> None:
    check_keys_once(["a.b=1", "a.c=2"])
    with pytest.raises(ConfigError, match=r"^--set a\.b\b.*'1'.*'2'"):  # wording: tests/test_bad_inputs.py
        check_keys_once(["a.b=1", "a.b=2"])


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        # mu = 2 won; in the other order, mu = 1 (below): a key given twice, once inside a section's mapping
        (["strategy={name: moon, mu: 1}", "strategy.mu=2"], r"^--set strategy\.mu is given twice \(1 inside --set "),
        (["train={lr: {a: 1}}", "train.lr.a=2"], r"^--set train\.lr\.a is given twice"),  # two levels down
        # a plugin given by its name alone holds its name: moon won, and a check of fedrod's options was skipped
        (["strategy=fedrod", "strategy.name=moon"], r"^--set strategy\.name is given twice \('fedrod' inside "),
        # a section after a key inside it: the key dropped in silence
        (["strategy.mu=2", "strategy={name: moon, mu: 1}"], r"^--set strategy=.* replaces the section that holds "),
        (["strategy.name=moon", "strategy.mu=2", "strategy=fedrod"], r"holds --set strategy\.name, given before it"),
        (["model.norm.name=gn", "model=cnn"], r"^--set model='cnn' replaces the section that holds --set model\.norm"),
    ],
)  # fmt: skip
def test_a_key_hidden_by_a_section_in_one_set_list_is_refused(overrides: list[str], refused: str) -> None:
    """Which value is used would depend on the order of the two: the section's mapping replaces the key's value."""
    with pytest.raises(ConfigError, match=refused):
        check_keys_once(overrides)


def test_a_section_then_keys_it_does_not_hold_refine_it_in_order() -> None:
    overrides = ["model.norm=gn", "model.norm.groups=4", "strategy={name: fedyogi, eta: 0.1}", "strategy.v0=0"]
    check_keys_once(overrides)
    raw = apply_overrides({}, overrides)
    assert raw["model"] == {"norm": {"name": "gn", "groups": 4}}
    assert raw["strategy"] == {"name": "fedyogi", "eta": 0.1, "v0": 0}


def test_section_keys_follow_a_location_through_optional_sections_and_lists() -> None:
    assert section_keys(RunConfig, ("eval",)) == ["every", "batch_size", "global_test", "clients", "personal"]
    assert section_keys(RunConfig, ("deploy", "certificates")) == ["ca", "cert", "key"]  # CertificatesConfig | None
    assert section_keys(RunConfig, ("output", "trackers", 0)) == ["name"]  # list[PluginBlock]
