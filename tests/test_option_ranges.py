"""Plugin options outside the range their maths needs are refused up front, naming the field and the range.

The rows are bad-input corpus rows (:mod:`tests.test_bad_inputs`: same ``run(...)`` helper, checked by its
own test: exit status 2, one ``fedsim: error:`` line, nothing created), grouped here by the audit that
found them: ``strategy: {name: fedyogi, v0: -1}`` passed validation and failed in round 1 with NaN weights;
stock Flower strategies named by dotted path took any float (``eta: -1`` trained uphill to the end).
Boundary values of each range still validate and build (no training: the run's own pre-flight checks).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import flwr.serverapp.strategy as flower_strategies
import pytest
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError

from fedsim.config import RunConfig, TrainConfig
from fedsim.data import DATASETS
from fedsim.engines.runner import check_halves
from fedsim.errors import RegistryError
from fedsim.experiment.resolve import load_experiment
from fedsim.models import MODELS
from fedsim.norms import NORMS
from fedsim.partitions import PARTITIONERS
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import wrap_flower_strategy
from tests import test_bad_inputs as corpus
from tests.conftest import small_config, write_config

run = corpus.run
FLOWER = "flwr.serverapp.strategy"


def flower(cls: str, key: str, value: object, allowed: str, **others: object) -> corpus.Case:
    """Flower's strategy ``cls`` given ``key: value`` (after ``others``): refused, naming the field and ``allowed``."""
    options = ", ".join(f"{k}: {v}" for k, v in {**others, key: value}.items())
    return run(f"strategy={{name: '{FLOWER}:{cls}', {options}}}", expect=(f"strategy.{key} = {value}", allowed))


# the gaps this audit closed
TIGHTENED: dict[str, corpus.Case] = {
    "fedyogi-v0-negative": run(
        "strategy={name: fedyogi, v0: -1}",
        expect=("strategy.v0 = -1", "'tau^2' or a finite number greater than or equal to 0"),
    ),
    "fedyogi-v0-text-one-message": run(
        "strategy={name: fedyogi, v0: big}", expect=("strategy.v0 = 'big'", "greater than or equal to 0")
    ),
    # stock Flower strategies: FLOWER_RANGES in strategies/base.py
    "flower-fedadam-eta-negative": flower("FedAdam", "eta", -1, "greater than 0"),
    "flower-fedadam-eta-zero": flower("FedAdam", "eta", 0, "greater than 0"),
    "flower-fedadam-eta-l-zero": flower("FedAdam", "eta_l", 0, "greater than 0"),
    "flower-fedadam-beta1-one": flower("FedAdam", "beta_1", 1, "less than 1"),
    "flower-fedadam-beta1-negative": flower("FedAdam", "beta_1", -0.1, "greater than or equal to 0"),
    "flower-fedadam-beta2-above-one": flower("FedAdam", "beta_2", 1.5, "less than 1"),
    "flower-fedadam-tau-zero": flower("FedAdam", "tau", 0, "greater than 0"),
    "flower-fedyogi-tau-zero": flower("FedYogi", "tau", 0, "greater than 0"),
    "flower-fedyogi-beta2-negative": flower("FedYogi", "beta_2", -1, "greater than or equal to 0"),
    "flower-fedadagrad-eta-negative": flower("FedAdagrad", "eta", -0.1, "greater than 0"),
    "flower-fedprox-mu-negative": flower("FedProx", "proximal_mu", -3, "greater than or equal to 0"),
    "flower-fedavgm-lr-zero": flower("FedAvgM", "server_learning_rate", 0, "greater than 0"),
    "flower-fedavgm-momentum-one": flower("FedAvgM", "server_momentum", 1, "less than 1"),
    "flower-fedavg-fraction-above-one": flower("FedAvg", "fraction_train", 2, "less than or equal to 1"),
    "flower-fedavg-min-nodes-negative": flower("FedAvg", "min_train_nodes", -1, "greater than or equal to 0"),
    "flower-trimmed-beta-half": flower("FedTrimmedAvg", "beta", 0.5, "less than 0.5"),
    "flower-qfedavg-lr-zero": flower("QFedAvg", "client_learning_rate", 0, "greater than 0"),
    "flower-qfedavg-q-negative": flower("QFedAvg", "q", -1, "greater than or equal to 0", client_learning_rate=0.1),
    "flower-krum-malicious-negative": flower("Krum", "num_malicious_nodes", -1, "greater than or equal to 0"),
    "flower-multikrum-select-zero": flower("MultiKrum", "num_nodes_to_select", 0, "greater than or equal to 1"),
    # a smoothing sigma beyond 1 outweighs the variance it smooths (fedsim.norms.base.Sigma): sigma=100 trained a
    # constant model (accuracy 0.1, loss ln 10) and exited 0
    "weierstrass-sigma-constant-model": run(
        "model.norm={name: ln_weierstrass, sigma: 100}", expect=("model.norm.sigma = 100", "less than or equal to 1")
    ),
    "weierstrass-sigma-huge": run(
        "model.norm={name: ln_weierstrass, sigma: 1e30}", expect=("model.norm.sigma = 1e+30", "less than or equal to 1")
    ),
    # 100,000 draws took 56 s: max_tries 1e9 would have run for days (partitions/dirichlet.py's MAX_TRIES)
    "dirichlet-max-tries-days": run(
        "partition={name: dirichlet, min_size: 500, max_tries: 1000000000}",
        expect=("partition.max_tries = 1000000000", "less than or equal to 10000"),
    ),
    "randomized-sigma-drowns-variance": run(
        "model.norm={name: ln_randomized, sigma: 1e6}",
        expect=("model.norm.sigma = 1000000.0", "less than or equal to 1"),
    ),
}

# ranges the audit found already stated, which the corpus did not yet pin
PINNED: dict[str, corpus.Case] = {
    "fedadam-beta2-one": run("strategy={name: fedadam, beta_2: 1}", expect=("strategy.beta_2 = 1", "less than 1")),
    "fedyogi-beta2-negative": run(
        "strategy={name: fedyogi, beta_2: -0.5}", expect=("strategy.beta_2 = -0.5", "greater than or equal to 0")
    ),
    "fedadagrad-tau-zero": run("strategy={name: fedadagrad, tau: 0}", expect=("strategy.tau = 0", "greater than 0")),
    "fedavgm-momentum-one": run(
        "strategy={name: fedavgm, server_momentum: 1}", expect=("strategy.server_momentum = 1", "less than 1")
    ),
    "feddyn-alpha-zero": run("strategy={name: feddyn, alpha: 0}", expect=("strategy.alpha = 0", "greater than 0")),
    "scaffold-eta-g-zero": run("strategy={name: scaffold, eta_g: 0}", expect=("strategy.eta_g = 0", "greater than 0")),
    "fedlc-tau-negative": run(
        "strategy={name: fedlc, tau: -1}", expect=("strategy.tau = -1", "greater than or equal to 0")
    ),
    "feddecorr-beta-negative": run(
        "strategy={name: feddecorr, beta: -1}", expect=("strategy.beta = -1", "greater than or equal to 0")
    ),
    "fedntd-beta-negative": run(
        "strategy={name: fedntd, beta: -1}", expect=("strategy.beta = -1", "greater than or equal to 0")
    ),
    "fedntd-tau-zero": run("strategy={name: fedntd, tau: 0}", expect=("strategy.tau = 0", "greater than 0")),
    "fedrod-gamma-negative": run(
        "strategy={name: fedrod, gamma: -1}", expect=("strategy.gamma = -1", "greater than or equal to 0")
    ),
    "fedetf-gamma-negative": run(
        "strategy={name: fedetf, gamma: -1}", expect=("strategy.gamma = -1", "greater than or equal to 0")
    ),
    "fedetf-scale-zero": run("strategy={name: fedetf, scale: 0}", expect=("strategy.scale = 0", "greater than 0")),
    "fedetf-etf-dim-huge": run(
        "strategy={name: fedetf, etf_dim: 1000000000}",
        expect=("strategy.etf_dim = 1000000000", "less than or equal to 65536"),
    ),
    "fedetf-etf-dim-below-classes": run(
        "strategy={name: fedetf, etf_dim: 3}", expect=("strategy.etf_dim = 3", "etf_dim >= ")
    ),
    "bn-momentum-above-one": run(
        "model.norm={name: bn, momentum: 2}", expect=("model.norm.momentum = 2", "less than or equal to 1")
    ),
    "goldschmidt-steps-zero": run(
        "model.norm={name: ln_goldschmidt, steps: 0}", expect=("model.norm.steps = 0", "greater than or equal to 1")
    ),
    "weierstrass-sigma-zero": run(
        "model.norm={name: ln_weierstrass, sigma: 0}", expect=("model.norm.sigma = 0", "greater than 0")
    ),
    "randomized-sigma-negative": run(
        "model.norm={name: ln_randomized, sigma: -1}", expect=("model.norm.sigma = -1", "greater than or equal to 0")
    ),
    # divisibility needs the model's widths: checked when the pre-flight builds the model, still before training
    "pln-group-size-not-dividing": run(
        "model.norm={name: pln, group_size: 3}", expect=("model.norm.group_size = 3", "does not divide", "64")
    ),
}

# float options finite in float64 but not in float32, where fedsim trains (a red-team pass found them: the run
# failed in round 1, or with a norm's eps trained a constant model and exited 0); and eps beyond 1, where it
# outweighs the variance of the features it normalises (eps=1e30: every output 0, a constant model)
FLOAT32: dict[str, corpus.Case] = {
    "lr-float32-overflow": run(
        "train.lr=1e308", expect=("train.lr: Input should be 0 or a float32 number", "(got 1e+308)")
    ),
    "lr-just-beyond-float32": run("train.lr=3.5e38", expect=("train.lr", "float32", "3.4e+38", "(got 3.5e+38)")),
    "weight-decay-float32-overflow": run("train.weight_decay=1e300", expect=("train.weight_decay", "float32")),
    "max-loss-float32-overflow": run("train.max_loss=1e300", expect=("train.max_loss", "float32")),
    "fedprox-mu-float32-overflow": run(
        "strategy={name: fedprox, mu: 1e308}", expect=("strategy.mu = 1e+308 for strategy 'fedprox'", "float32")
    ),
    "fedlc-tau-float32-overflow": run("strategy={name: fedlc, tau: 1e39}", expect=("strategy.tau = 1e+39", "float32")),
    "flower-fedadam-eta-float32-overflow": run(
        f"strategy={{name: '{FLOWER}:FedAdam', eta: 1e308}}", expect=("strategy.eta = 1e+308", "float32")
    ),
    "ln-eps-float32-overflow": run(
        "model.norm={name: ln, eps: 1e308}", expect=("model.norm.eps = 1e+308", "less than or equal to 1")
    ),
    "gn-eps-constant-model": run(
        "model.norm={name: gn, eps: 1e30}", expect=("model.norm.eps = 1e+30", "less than or equal to 1")
    ),
    # and nonzero values below float32's smallest normal number: 0 there, or a denormal many CPUs flush to 0 (FedAdam's
    # tau: 1e-50 divided by 0 in round 1; an lr or eps of 1e-50 ran to exit 0 as 0)
    "lr-float32-underflow": run("train.lr=1e-50", expect=("train.lr", "magnitude 1.2e-38 to 3.4e+38", "(got 1e-50)")),
    "flower-fedadam-tau-float32-underflow": run(
        f"strategy={{name: '{FLOWER}:FedAdam', tau: 1e-50}}", expect=("strategy.tau = 1e-50", "float32")
    ),
    "ln-eps-float32-denormal": run("model.norm={name: ln, eps: 1e-45}", expect=("model.norm.eps = 1e-45", "float32")),
    "weierstrass-sigma-float32-overflow": run(
        "model.norm={name: ln_weierstrass, sigma: 1e300}",
        expect=("model.norm.sigma = 1e+300", "less than or equal to 1"),
    ),
}

CASES = {f"range-{k}": v for k, v in {**TIGHTENED, **PINNED, **FLOAT32}.items()}
assert not CASES.keys() & corpus.CASES.keys()


def corpus_rows(cases: dict[str, corpus.Case], setups: dict[str, Callable[[Path], object]] | None = None) -> Callable:
    """A test of each of ``cases`` (with ``setups``, the files they need) exactly as a row of the bad-input corpus;
    and no run directory made, not even for a row that may create files (a decode cache)."""

    @pytest.mark.parametrize("case_id", list(cases))
    def test(case_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(corpus.CASES, case_id, cases[case_id])
        for name, setup in (setups or {}).items():
            monkeypatch.setitem(corpus.SETUPS, name, setup)
        corpus.test_bad_input_gets_one_clear_line(case_id, tmp_path, capsys, monkeypatch)
        assert not (tmp_path / "runs").exists()  # small_config's output.dir

    return test


test_out_of_range_option_is_one_line_before_training = corpus_rows(CASES)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("strategy={name: fedyogi, v0: 0}", {"v0": 0.0}),  # Flower's FedYogi
        ("strategy={name: fedyogi, v0: 1.0e-12}", {"v0": 1e-12}),
        ("strategy={name: fedyogi, v0: tau^2}", {"v0": "tau^2"}),
        ("strategy={name: fedadam, beta_1: 0, beta_2: 0}", {"beta_1": 0.0, "beta_2": 0.0}),
        (
            f"strategy={{name: '{FLOWER}:FedAdam', eta: 1.0e-9, eta_l: 1.0e-9, beta_1: 0, beta_2: 0.999, tau: 1.0e-9}}",
            {"eta": 1e-9, "beta_1": 0.0, "beta_2": 0.999, "tau": 1e-9},
        ),
        (f"strategy={{name: '{FLOWER}:FedYogi', beta_1: 0.999, beta_2: 0}}", {"beta_1": 0.999, "beta_2": 0.0}),
        (f"strategy={{name: '{FLOWER}:FedProx', proximal_mu: 0}}", {"proximal_mu": 0.0}),
        (f"strategy={{name: '{FLOWER}:FedAvgM', server_momentum: 0.99}}", {"server_momentum": 0.99}),
        (f"strategy={{name: '{FLOWER}:FedAvg', fraction_train: 1, min_train_nodes: 0}}", {"min_train_nodes": 0}),
        (f"strategy={{name: '{FLOWER}:FedTrimmedAvg', beta: 0.49}}", {"beta": 0.49}),
        (f"strategy={{name: '{FLOWER}:QFedAvg', client_learning_rate: 0.1, q: 0}}", {"q": 0.0}),
        (
            f"strategy={{name: '{FLOWER}:MultiKrum', num_malicious_nodes: 0, num_nodes_to_select: 1}}",
            {"num_nodes_to_select": 1},
        ),
    ],
)
def test_range_boundaries_are_accepted(tmp_path: Path, override: str, expected: dict[str, object]) -> None:
    experiment = load_experiment(write_config(tmp_path, small_config(tmp_path)), [override])
    params = experiment.strategy.params
    assert {k: getattr(params, k) for k in expected} == expected
    check_halves(experiment)  # the run's pre-flight: model and server half built as the run would


def _unranged(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The int and float options of ``model`` and its sections that state no range: no bound (ge, gt, le, lt)
    on the number and no validator of the field's own (which states it in its message)."""
    validated = {f for d in model.__pydantic_decorators__.field_validators.values() for f in d.info.fields}
    found = []
    for name, field in model.model_fields.items():
        if inspect.isclass(field.annotation) and issubclass(field.annotation, BaseModel):
            found += _unranged(field.annotation, f"{prefix}{name}.")
        elif name not in validated and _bare_number(field.annotation, field.metadata):
            found.append(f"{prefix}{name}")
    return found


def _bare_number(annotation: Any, metadata: list[Any]) -> bool:
    """Whether ``annotation`` holds an int or a float (alone, optional, a list's items...) with no bound."""
    if any(isinstance(m, Ge | Gt | Le | Lt) for m in metadata):
        return False
    if get_origin(annotation) is Annotated:
        inner, *extra = get_args(annotation)
        return _bare_number(inner, extra)
    return annotation in (int, float) or any(_bare_number(a, []) for a in get_args(annotation))


def _flower_specs() -> dict[str, type]:
    """Every Strategy class Flower ships, wrapped as a config would name it (those a config cannot build skipped)."""
    specs = {}
    for name, obj in vars(flower_strategies).items():
        if inspect.isclass(obj) and issubclass(obj, flower_strategies.Strategy):
            try:
                specs[f"{FLOWER}:{name}"] = wrap_flower_strategy(obj)
            except RegistryError as err:  # the differential-privacy wrappers: they need the strategy they wrap
                assert f"{name} needs 'strategy'" in str(err)
    return specs


def _float_options(model: type[BaseModel]) -> Iterator[tuple[type[BaseModel], str]]:
    """``(section, key)`` for every option of ``model`` and its sections that takes a float."""
    for name, field in model.model_fields.items():
        if inspect.isclass(field.annotation) and issubclass(field.annotation, BaseModel):
            yield from _float_options(field.annotation)
        elif _takes_float(field.annotation):
            yield model, name


def _takes_float(annotation: Any) -> bool:
    return annotation is float or any(_takes_float(a) for a in get_args(annotation))


def test_no_float_option_takes_a_number_float32_does_not_hold() -> None:
    """fedsim trains in float32: a float option beyond its range (3.4e38), or nonzero below its smallest normal number
    (1.2e-38), is refused by every plugin's Params, every
    Flower strategy's and every config section, whatever its own range (fedsim.registry.Float32Options)."""
    params = [
        entry.obj.Params for registry in (STRATEGIES, NORMS, MODELS, PARTITIONERS, DATASETS) for entry in registry
    ]
    options = [
        option for model in [*params, *(s.Params for s in _flower_specs().values()), RunConfig]
        for option in _float_options(model)
    ]  # fmt: skip
    assert len(options) > 50
    for beyond in (1e39, -1e39, 1e-39, -1e-50):  # beyond float32's largest; below its smallest normal number
        accepted = []
        for section, key in options:
            try:
                section.model_validate({key: beyond})
            except ValidationError as err:
                if any(e["loc"][:1] == (key,) for e in err.errors()):
                    continue
            accepted.append(f"{section.__name__}.{key}")
        assert accepted == [], beyond
    TrainConfig.model_validate({"lr": 3.4e38})  # float32's largest: a float32 number, if not a useful lr
    TrainConfig.model_validate({"lr": 1.2e-38})  # and its smallest normal one


def test_every_numeric_option_states_its_range() -> None:
    """A new option of a built-in plugin, of a Flower strategy or of the config that is a number without a
    range fails here: declare it (``Field(ge=..)``, FLOWER_RANGES in strategies/base.py) or check it in a
    validator of its own."""
    params = {
        f"{registry.kind} {entry.name}": entry.obj.Params
        for registry in (STRATEGIES, NORMS, MODELS, PARTITIONERS, DATASETS)
        for entry in registry
        if entry.source == "builtin"
    }
    params |= {name: spec.Params for name, spec in _flower_specs().items()}
    assert len(params) > 50
    unranged = {name: found for name, model in {**params, "config": RunConfig}.items() if (found := _unranged(model))}
    assert unranged == {}
