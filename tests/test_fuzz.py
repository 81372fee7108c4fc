"""A fuzzer at fedsim's input boundary: configs, ``--set`` values and data files generated from the config's
schema and from mutations of a valid config, each given to ``fedsim run`` as a user would give it.

Every outcome must be a run (exit 0) or one line ``fedsim: error: ...`` with exit status 2 (a config with
several bad fields: one line per field), and never an exception escaping the command line (a traceback).
The run itself stops where training would start (the engine is replaced by a stub): what is fuzzed is
everything fedsim checks before it, which is where every bad input must be caught.

The suite runs it with a fixed seed (hypothesis' ``derandomize``) and a small budget (30 inputs per test);
``pytest -m fuzz`` runs 1,000 fresh random inputs per test (tests/conftest.py sets FEDSIM_FUZZ_LONG for it).
"""

from __future__ import annotations

import io
import os
import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from fedsim.app.cli import main
from fedsim.config import RunConfig
from tests.conftest import MNIST_SMALL, small_config

pytestmark = pytest.mark.fuzz
LONG = os.environ.get("FEDSIM_FUZZ_LONG") == "1"
BUDGET = settings(
    max_examples=1000 if LONG else 30,
    derandomize=not LONG,  # the suite: the same inputs on every machine and every run
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)


def schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the config's typed sections (plugin blocks: their name and a few options)."""
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        keys.append(key)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += schema_keys(annotation, key + ".")
    return keys


KEYS = schema_keys(RunConfig) + [
    "model.norm", "model.norm.name", "model.norm.groups", "model.norm.eps", "model.hidden", "model.width",
    "strategy.name", "strategy.mu", "strategy.eta", "strategy.tau", "strategy.beta_1", "strategy.proximal_mu",
    "partition.name", "partition.beta", "partition.classes_per_client", "data.dataset.name",
    "unknown", "train.unknown", "model.norm.unknown",
]  # fmt: skip

HOSTILE_SCALARS = st.one_of(
    st.sampled_from([
        0, -1, 1, 2, 3, 10**6, 2**31, 2**63, -(2**63), 10**30, 0.0, -0.0, 1e-300, 1e308, float("nan"),
        float("inf"), float("-inf"), True, False, None, "", " ", "auto", "none", "cpu", "cuda", "ln", "fedavg",
        "/", "..", "../../x", "/dev/zero", "/proc", "a" * 300, "1e-3", "0x10", "nan", "~", "null", "[]", "{}",
        "é", "\u202e", "💥",
    ]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(string.printable, max_size=20),
)  # fmt: skip
VALUES = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(string.ascii_lowercase, max_size=6), inner, max_size=3)
    ),  # fmt: skip
    max_leaves=6,
)


def fuzzed(test: Any) -> Any:
    """A fuzz test: the suite's budget (or the long one), runs stopped where training would start."""
    return pytest.mark.usefixtures("stub_engine")(BUDGET(test))


def yaml_text(value: Any) -> str:
    """A value as a ``--set`` gives it: YAML in one line."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


@pytest.fixture
def stub_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs stop where training would start: a finished run of no rounds, for every engine."""
    import fedsim.engines

    monkeypatch.setattr(fedsim.engines, "run_with_engine", lambda experiment, resume=False: {
        "run_dir": experiment.config.output.run_dir,
    })  # fmt: skip


def check_outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse
        code = stop.code
    except BaseException as err:  # noqa: BLE001 (the finding: anything escaping the command line)
        pytest.fail(f"fedsim {' '.join(argv)[:500]} raised {type(err).__name__}: {str(err)[:500]}")
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err[-2000:]
    if code == 0:
        return
    assert code == 2, (argv, code, err[-2000:])
    # one line; a config with several bad fields gets one line per field (none indented, as a traceback is)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[0].startswith("fedsim: error: "), (argv, err[-2000:])
    assert not [line for line in lines if line[0].isspace()], (argv, err[-2000:])


def base_config(tmp_path: Path) -> dict[str, Any]:
    return small_config(tmp_path, train={"rounds": 1, "num_clients": 4, "local_steps": 1})


@fuzzed
@given(overrides=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=3))
def test_set_values_from_the_schema(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], overrides: list[tuple[str, Any]]
) -> None:
    tmp = tmp_path_factory.mktemp("set")
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp)))
    check_outcome(["run", str(path), "--set", *(f"{k}={yaml_text(v)}" for k, v in overrides)], capsys)


# YAML a user may type after --set key= that no generated value dumps to: deep nesting, complex keys, tags,
# aliases, directives
RAW_YAML = st.one_of(
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 3000).map(lambda n: "{a: " * n + "1" + "}" * n),
    st.integers(1, 3000).map(lambda n: "[" * n),
    st.sampled_from([
        "? [a, b]\n: 1", "{? [a, b] : 1}", "{[a]: 1}", "&a [*a]", "*a", "!!python/object:os.system x",
        "!!binary aGk=", "!!set {a, b}", "!!omap [a: 1]", "%YAML 1.2\n--- 1", "--- 1\n--- 2", "'", '"', "{", "]",
        "- a\nb: 1", "a: b: c", "\t1", "1\x00", "\ufeff1", "0o17", "1_000", "2001-12-14", "2001-12-14t21:59:43",
        ".inf", "-.inf", ".nan", "0b101", "1:20", "=1", "x=y=z",
    ]),
)  # fmt: skip


@fuzzed
@given(key=st.sampled_from(KEYS), text=RAW_YAML)
@pytest.mark.slow
def test_set_raw_yaml_text(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], key: str, text: str
) -> None:
    tmp = tmp_path_factory.mktemp("raw")
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp)))
    check_outcome(["run", str(path), "--set", f"{key}={text}"], capsys)
    path.write_text(f"{key.split('.')[0]}: {text}\n" + path.read_text())  # the same text in the file itself
    check_outcome(["run", str(path)], capsys)


def mutate(tree: Any, data: st.DataObject) -> Any:
    """One structural change somewhere in a config: a key dropped, a value replaced, a section flattened."""
    if not isinstance(tree, dict) or not tree:
        return data.draw(VALUES)
    key = data.draw(st.sampled_from(sorted(tree)))
    action = data.draw(st.sampled_from(["drop", "replace", "descend", "descend", "add"]))
    tree = dict(tree)
    if action == "drop":
        del tree[key]
    elif action == "replace":
        tree[key] = data.draw(VALUES)
    elif action == "add":
        tree[data.draw(st.text(string.ascii_lowercase + "_.", min_size=1, max_size=8))] = data.draw(VALUES)
    else:
        tree[key] = mutate(tree[key], data)
    return tree


@fuzzed
@given(data=st.data())
def test_mutated_configs(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    tmp = tmp_path_factory.mktemp("mutated")
    cfg = base_config(tmp)
    for _ in range(data.draw(st.integers(1, 3))):
        cfg = mutate(cfg, data)
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    check_outcome(["run", str(path)], capsys)


@fuzzed
@given(data=st.data())
def test_corrupted_config_text(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    tmp = tmp_path_factory.mktemp("text")
    cfg = base_config(tmp)
    cfg["output"]["dir"] = "runs"  # relative to the working directory below: the text is the same in every example
    text = bytearray(yaml.safe_dump(cfg).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        change = data.draw(st.sampled_from(["insert", "delete", "flip"]))
        noise = data.draw(st.binary(min_size=1, max_size=8) | st.sampled_from([b"[", b"{", b"- ", b": ", b"&a", b"*a"]))
        if change == "insert":
            text[at:at] = noise
        elif change == "delete":
            del text[at : at + len(noise)]
        else:
            text[at : at + len(noise)] = bytes(b ^ 0xFF for b in noise)
    path = tmp / "cfg.yaml"
    path.write_bytes(bytes(text))
    here = Path.cwd()
    os.chdir(tmp)  # whatever the damaged text names as its output, it lands in this example's directory
    try:
        check_outcome(["run", str(path)], capsys)
    finally:
        os.chdir(here)


@fuzzed
@given(data=st.data())
@pytest.mark.slow
def test_corrupted_dataset_files(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    """The shipped npz, with its arrays changed (labels, shapes, dtypes) or its bytes damaged."""
    tmp = tmp_path_factory.mktemp("npz")
    arrays = dict(np.load(MNIST_SMALL))
    name = data.draw(st.sampled_from(sorted(arrays)))
    action = data.draw(st.sampled_from(["labels", "drop", "shape", "dtype", "bytes", "truncate"]))
    path = tmp / "data.npz"
    if action in ("bytes", "truncate"):
        raw = bytearray(MNIST_SMALL.read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1))
        if action == "truncate":
            del raw[at:]
        else:
            raw[at] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(raw))
    else:
        if action == "labels":
            arrays[name] = arrays[name].astype(np.int64)
            arrays[name].flat[data.draw(st.integers(0, arrays[name].size - 1))] = data.draw(
                st.sampled_from([-1, 10, 255, 10**6, 2**40])
            )
        elif action == "drop":
            del arrays[name]
        elif action == "shape":
            arrays[name] = arrays[name].reshape(-1)[: data.draw(st.integers(0, 50))]
        else:
            arrays[name] = arrays[name].astype(data.draw(st.sampled_from([np.float16, np.int8, np.bool_, np.str_])))
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        path.write_bytes(buffer.getvalue())
    cfg = base_config(tmp)
    cfg["data"]["root"] = str(path)
    config_path = tmp / "cfg.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    check_outcome(["run", str(config_path)], capsys)
