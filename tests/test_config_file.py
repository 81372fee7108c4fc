"""Reading a config file (fedsim.config_file): YAML, --set overrides, and every problem on one line naming the
field and what is allowed."""

from __future__ import annotations

import json
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
    twice = f"fedsim: error: {path}: key 'every' is given twice (line {len(text.splitlines()) + 1}): give it once\n"
    assert run_cli(capsys, path) == (2, twice)
    path.write_text(text.replace("eval:\n  every: 1\n", "eval:\n  <<: {batch_size: 64}\n  every: 1\n  every: 2\n"))
    code, err = run_cli(capsys, path)
    assert code == 2 and err.startswith(f"fedsim: error: {path}: key 'every' is given twice"), err


@pytest.mark.parametrize(
    ("yaml_text", "problem"),
    [
        (
            "seed: !!python/object/apply:os.system ['touch {tmp}/pwned']\n",
            "could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system' at line 1",
        ),
        ("seed: !custom 1\n", "could not determine a constructor for the tag '!custom' at line 1"),
        ("train:\n  <<: 5\n", "expected a mapping or list of mappings for merging, but found scalar at line 2"),
    ],
)
def test_yaml_tags_are_refused_naming_the_tag_and_what_a_config_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, problem: str
) -> None:
    path = tmp_path / "tagged.yaml"
    path.write_text(yaml_text.replace("{tmp}", str(tmp_path)))
    assert run_cli(capsys, path) == (
        2, f"fedsim: error: {path}: {problem}: a config holds plain YAML values (mappings, lists, text, numbers, "
        "true/false, null), anchors, aliases and << merges of mappings, no other tags\n"
    )  # fmt: skip
    assert not (tmp_path / "pwned").exists()


SECTIONS = "name, seed, engine, data, partition, model, strategy, train, eval, simulation, output, diagnostics, deploy"


@pytest.mark.parametrize(
    ("override", "where", "valid"),
    [
        ("foo=1", "foo", SECTIONS),
        ("simulation.client_resources.foo=1", "simulation.client_resources.foo", "num_cpus, num_gpus"),
        ("deploy.certificates={ca: a, cert: b, key: c, foo: 1}", "deploy.certificates.foo", "ca, cert, key"),
        ("eval.foo=1", "eval.foo", "every, batch_size, global_test, personal"),
    ],
)
def test_an_unknown_key_at_any_level_lists_the_valid_keys_of_its_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, where: str, valid: str
) -> None:
    path = write_config(tmp_path, small_config(tmp_path))
    code, err = run_cli(capsys, path, override)
    assert code == 2 and err.startswith(f"fedsim: error: {where}: unknown key (got 1); valid keys: {valid}\n"), err


@pytest.mark.parametrize(
    ("sections", "overrides", "problems"),
    [
        (  # the file's errors and --set's together, each with its field, value and what is allowed
            {"train": {"rounds": 0, "lr": -1, "bogus": 3}},
            ["eval.every=-3"],
            [
                "train.rounds: Input should be greater than or equal to 1 (got 0)",
                "train.lr: Input should be greater than 0 (got -1)",
                "train.bogus: unknown key (got 3); valid keys: rounds, num_clients, clients_per_round, local_steps",
                "eval.every: Input should be greater than or equal to 1 (got -3)",
            ],
        ),
        (  # a plugin's options, checked once the sections are valid
            {"strategy": {"name": "fedyogi", "eta": -1, "beta_1": 3}},
            ["strategy.v0=x"],
            [
                "strategy.eta = -1 for strategy 'fedyogi': Input should be greater than 0",
                "strategy.beta_1 = 3 for strategy 'fedyogi': Input should be less than 1",
                "strategy.v0 = 'x' for strategy 'fedyogi': Input should be 'tau^2' or a finite number greater than",
            ],
        ),
    ],
    ids=["sections", "plugin-options"],
)
def test_several_errors_are_one_line_naming_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sections: dict, overrides: list[str], problems: list[str]
) -> None:
    """Every problem at once, numbered (a problem may hold a semicolon of its own), on the one line an error is,
    not pydantic's line per error."""
    code, err = run_cli(capsys, write_config(tmp_path, small_config(tmp_path, **sections)), *overrides)
    assert code == 2 and err.startswith(f"fedsim: error: {len(problems)} errors: (1) ") and err.count("\n") == 1, err
    for number, problem in enumerate(problems, 1):
        assert f"({number}) {problem}" in err, err


def test_overrides_set_dotted_keys_in_sections_made_as_needed() -> None:
    """A value parsed as YAML, a section made where there is none, a plugin given by its name alone made
    ``{name: <it>}``; a key inside a value that is not a section is refused naming both."""
    raw = apply_overrides({"model": "cnn"}, ["model.norm=gn", "train.lr=1e-3"])
    assert raw == {"model": {"name": "cnn", "norm": "gn"}, "train": {"lr": 0.001}}
    with pytest.raises(ConfigError, match=r"^--set seed\.x: 'seed' is not a section$"):
        apply_overrides({"seed": 1}, ["seed.x=1"])


def test_a_key_given_twice_in_one_set_list_is_refused_with_both_values() -> None:
    check_keys_once(["a.b=1", "a.c=2"])
    with pytest.raises(ConfigError, match=r"^--set a\.b is given twice \('1', then '2'\): give it once$"):
        check_keys_once(["a.b=1", "a.b=2"])


def test_section_keys_follow_a_location_through_optional_sections_and_lists() -> None:
    assert section_keys(RunConfig, ("eval",)) == ["every", "batch_size", "global_test", "personal"]
    assert section_keys(RunConfig, ("deploy", "certificates")) == ["ca", "cert", "key"]  # CertificatesConfig | None
    assert section_keys(RunConfig, ("output", "trackers", 0)) == ["name"]  # list[PluginBlock]
