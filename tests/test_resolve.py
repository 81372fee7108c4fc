"""One experiment, resolved once (fedsim/experiment/resolve.py): every plugin a config names looked up with its
options validated, each error naming its YAML block, once per process; what a dataset generated per client cannot
serve; the federation refused when a run cannot learn from it or a round may train nothing; the model built for the
dataset's classes and image shape, as the strategy adapts it, from the seed alone; the strategy's server half; a
strategy's error named as the strategy's. Plugins of this file's own by their ``tests.test_resolve:Name`` paths;
shapes and counts expected from the data by hand."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.serverapp.strategy import FedAvg, Strategy

from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.data import DATASETS, ArrayDataset, DatasetLoader, DataSource
from fedsim.data.generated import ClientArrays, GeneratedLoader
from fedsim.errors import ConfigError, DataError
from fedsim.experiment import federation
from fedsim.experiment.federation import GeneratedFederation, load_federation
from fedsim.experiment.resolve import Experiment, build_server, call_strategy, check_generated, load_experiment, resolve
from fedsim.models import MODELS, FedsimModel
from fedsim.norms import NORMS
from fedsim.partitions import PARTITIONERS, Labels, Partition, Partitioner
from fedsim.strategies import STRATEGIES, StrategySpec
from fedsim.strategies.server_half import ServerSetup
from tests.conftest import small_config, write_config

HERE = "tests.test_resolve"


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(federation, "_CACHE", {})  # the federations a test's experiments split, its own


def config(tmp_path: Path, **sections: Any) -> RunConfig:
    return parse_config(small_config(tmp_path, **sections))


# --- plugins of this file's own --------------------------------------------------------------------------------


class Small(DatasetLoader):
    """3 classes of 3x4x4 images, 30 training (10 a class) and 9 test (3 a class) images."""

    def load(self, source: DataSource) -> ArrayDataset:
        g = torch.Generator().manual_seed(0)
        x_train = torch.randint(0, 256, (30, 3, 4, 4), dtype=torch.uint8, generator=g)
        x_test = torch.randint(0, 256, (9, 3, 4, 4), dtype=torch.uint8, generator=g)
        return ArrayDataset(x_train, torch.arange(30) % 3, x_test, torch.arange(9) % 3, ["r", "g", "b"], "small")


class OneClass(DatasetLoader):
    """Every image of one class: nothing a run could learn."""

    def load(self, source: DataSource) -> ArrayDataset:
        x = torch.zeros(8, 1, 2, 2, dtype=torch.uint8)
        return ArrayDataset(x, torch.zeros(8, dtype=torch.int64), x, torch.zeros(8, dtype=torch.int64), ["c"], "one")


class FirstClientOnly(Partitioner):
    """Every sample to client 0; the other clients get none."""

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        empty = [np.array([], dtype=np.int64)] * (num_clients - 1)
        return Partition([np.arange(len(labels.train))] + empty, [np.arange(len(labels.test))] + empty)


class GeneratedImages(GeneratedLoader):
    """Images generated per client (the built-in synthetic one generates feature vectors)."""

    images = True

    @property
    def classes(self) -> list[str]:
        return ["a", "b"]

    @property
    def in_shape(self) -> tuple[int, int, int]:
        return (1, 2, 2)

    def client(self, cid: int) -> ClientArrays:
        x = torch.full((2, 1, 2, 2), cid % 256, dtype=torch.uint8)
        return ClientArrays(x, torch.tensor([0, 1]), x, torch.tensor([0, 1]))

    def fingerprint(self) -> str:
        return "0" * 64


ADAPTED: list[tuple[FedsimModel, FedsimModel, int]] = []  # AdaptsToACopy's (given, returned, seed)


class AdaptsToACopy(StrategySpec):
    """FedAvg whose run's model is a copy of the recipe's, its classifier zeroed."""

    def adapt_model(self, model: FedsimModel, seed: int) -> FedsimModel:
        other = copy.deepcopy(model)
        torch.nn.init.zeros_(other.classifier.weight)
        ADAPTED.append((model, other, seed))
        return other


class AdaptsToNone(StrategySpec):
    """An adapt_model that changes the model in place and returns nothing."""

    def adapt_model(self, model: FedsimModel, seed: int) -> FedsimModel:
        return None  # type: ignore[return-value]


class AdaptRefuses(StrategySpec):
    """An adapt_model that refuses the model with fedsim's own error."""

    def adapt_model(self, model: FedsimModel, seed: int) -> FedsimModel:
        raise DataError("model: this strategy needs a classifier of at least 20 classes")


SETUPS: list[ServerSetup] = []  # what ServerRecords' server half was given


class ServerRecords(StrategySpec):
    """A server half built from what it is given (Flower's FedAvg, every node)."""

    def server(self, setup: ServerSetup) -> Strategy:
        SETUPS.append(setup)
        return FedAvg(fraction_evaluate=0.0)


class ServerRaises(StrategySpec):
    """A server half that cannot be built."""

    def server(self, setup: ServerSetup) -> Strategy:
        raise KeyError("server_lr")


# --- looking plugins up ----------------------------------------------------------------------------------------


def test_every_plugin_the_config_names_is_looked_up_with_its_options_validated(tmp_path: Path) -> None:
    sections = small_config(
        tmp_path,
        model={"name": "mlp", "hidden": [32, 16], "norm": {"name": "gn", "groups": 4}},
        strategy={"name": "FedProx", "mu": 0.3},
    )
    cfg = parse_config({**sections, "partition": {"name": "n_class", "classes_per_client": 3}})
    experiment = resolve(cfg)
    assert experiment.config == cfg
    assert type(experiment.loader) is DATASETS.get("npz")
    assert type(experiment.partitioner) is PARTITIONERS.get("n_class")
    assert experiment.partitioner.params == PARTITIONERS.get("n_class").Params(classes_per_client=3)
    assert type(experiment.normaliser) is NORMS.get("gn")
    assert experiment.normaliser.params == NORMS.get("gn").Params(groups=4)  # the rest its defaults
    assert (experiment.model.name, experiment.model.cls, experiment.model.where) == ("mlp", MODELS.get("mlp"), "model")
    assert experiment.model.params == MODELS.get("mlp").Params(hidden=[32, 16])
    assert type(experiment.strategy) is STRATEGIES.get("fedprox")  # names are case-insensitive
    assert experiment.strategy.params == STRATEGIES.get("fedprox").Params(mu=0.3)


def test_a_config_is_resolved_once_per_process(tmp_path: Path) -> None:
    first = resolve(config(tmp_path))
    assert resolve(config(tmp_path)) is first  # another RunConfig of the same JSON
    assert load_experiment(write_config(tmp_path, small_config(tmp_path))) is first
    other = resolve(config(tmp_path, train={"lr": 0.07}))
    assert other is not first and other.config.train.lr == 0.07


def test_load_experiment_applies_the_overrides_to_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, small_config(tmp_path))
    experiment = load_experiment(path, ["train.lr=0.2", "strategy={name: fedprox, mu: 0.5}"])
    assert experiment.config.train.lr == 0.2 and experiment.strategy.params.mu == 0.5
    assert type(experiment.strategy) is STRATEGIES.get("fedprox")


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"partition": {"name": "dirichlet", "beta": -1}}, "partition.beta"),
        ({"data": {"dataset": {"name": "npz", "colour": 1}}}, "data.dataset.colour"),
        ({"model": {"norm": {"name": "gn", "groups": 0}}}, "model.norm.groups"),
        ({"model": {"depth": 3}}, "model.depth"),
        ({"strategy": {"name": "fedprox", "mu": -1}}, "strategy.mu"),
        ({"strategy": {"name": "no_such_strategy"}}, "strategy.name"),
        ({"model": {"norm": "no_such_norm"}}, "model.norm.name"),
    ],
)
def test_a_plugins_bad_name_or_option_names_its_yaml_block(
    tmp_path: Path, sections: dict[str, Any], field: str
) -> None:
    cfg = config(tmp_path, **sections)  # read as a config; refused only when resolved
    with pytest.raises(ConfigError) as err:
        resolve(cfg)
    assert str(err.value).startswith(field), str(err.value)


def test_a_client_count_the_partitioner_cannot_split_is_refused_before_any_data_is_read(tmp_path: Path) -> None:
    cfg = config(tmp_path, partition="centralised", data={"root": str(tmp_path / "nowhere.npz")})
    with pytest.raises(ConfigError, match=r"train\.num_clients") as err:
        resolve(cfg)
    assert "nowhere" not in str(err.value)
    resolve(config(tmp_path, partition="centralised", train={"num_clients": 1}))  # one client: taken


# --- a dataset generated per client ----------------------------------------------------------------------------

SYNTHETIC = {"dataset": {"name": "synthetic", "dim": 5, "num_classes": 3}, "augment": False}


def generated(tmp_path: Path, partition: str = "natural", **sections: Any) -> RunConfig:
    data = {**SYNTHETIC, **sections.pop("data", {})}
    eval_ = {"global_test": False, **sections.pop("eval", {})}
    return config(tmp_path, data=data, partition=partition, eval=eval_, **sections)


def synthetic_loader() -> DatasetLoader:
    return DATASETS.resolve("synthetic", {"dim": 5, "num_classes": 3}, "data.dataset").create()


def test_a_loaded_dataset_takes_any_partitioner_but_natural(tmp_path: Path) -> None:
    npz = DATASETS.resolve("npz", {}, "data.dataset").create()
    for name in ("dirichlet", "iid", "n_class"):
        check_generated(config(tmp_path, partition=name), npz)
    with pytest.raises(ConfigError, match=r"^partition: 'natural'") as err:
        check_generated(config(tmp_path, partition="natural"), npz)
    assert "'npz'" in str(err.value)


def test_a_generated_dataset_with_natural_and_nothing_it_cannot_serve_is_taken(tmp_path: Path) -> None:
    check_generated(generated(tmp_path), synthetic_loader())
    experiment = resolve(generated(tmp_path))
    fed = experiment.federation()  # nothing to check of a whole dataset: it has none
    assert isinstance(fed, GeneratedFederation) and fed.num_classes == 3 and fed.in_shape == (1, 1, 5)


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"partition": "iid"}, "partition: 'iid'"),
        ({"eval": {"global_test": True}}, "eval.global_test"),
        ({"diagnostics": {"isometry": True}}, "diagnostics"),
        ({"diagnostics": {"grad_norms": True}}, "diagnostics"),
        ({"data": {"augment": True}}, "data.augment"),
        ({"data": {"normalize": True}}, "data.normalize"),
    ],
)
def test_what_a_generated_dataset_cannot_serve_is_refused_naming_the_field(
    tmp_path: Path, sections: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        check_generated(generated(tmp_path, **sections), synthetic_loader())
    assert str(err.value).startswith(field) and "'synthetic'" in str(err.value), str(err.value)


def test_a_generated_dataset_of_images_may_be_augmented_but_not_normalised(tmp_path: Path) -> None:
    images = GeneratedImages(GeneratedLoader.Params())
    check_generated(generated(tmp_path, data={"augment": True}), images)
    with pytest.raises(ConfigError, match=r"^data\.normalize"):
        check_generated(generated(tmp_path, data={"normalize": True}), images)
    with pytest.raises(ConfigError, match=r"^data\.augment"):
        check_generated(generated(tmp_path, data={"augment": True}), synthetic_loader())


# --- the federation --------------------------------------------------------------------------------------------


def test_the_federation_is_the_configs_split_once(tmp_path: Path) -> None:
    experiment = resolve(config(tmp_path))
    fed = experiment.federation()
    assert fed is experiment.federation()
    assert fed is load_federation(experiment.config, experiment.loader, experiment.partitioner)
    assert fed.dataset is not None and len(fed.dataset.y_train) == 5000 and len(fed.partition.train) == 4


@pytest.mark.parametrize(("per_round", "refused"), [(None, False), (4, False), (3, True), (1, True)])
def test_a_split_where_a_round_may_train_nothing_is_refused(
    tmp_path: Path, per_round: int | None, refused: bool
) -> None:
    # clients 1, 2, 3 get no training images: a round of 3 or fewer may sample only them; of all 4, never
    experiment = resolve(config(tmp_path, partition=f"{HERE}:FirstClientOnly", train={"clients_per_round": per_round}))
    if refused:
        with pytest.raises(DataError, match=r"train\.clients_per_round"):
            experiment.federation()
    else:
        assert [len(p) for p in experiment.federation().partition.train] == [5000, 0, 0, 0]


class NoTestButFirst(Partitioner):
    """Every client trains on a quarter of the images; only client 0 has test images."""

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        empty = [np.array([], dtype=np.int64)] * (num_clients - 1)
        train = list(np.array_split(np.arange(len(labels.train)), num_clients))
        return Partition(train, [np.arange(len(labels.test))] + empty)


@pytest.mark.parametrize(("scored", "refused"), [(None, False), (4, False), (3, True), (1, True)])
def test_a_split_where_a_round_may_score_nothing_is_refused(tmp_path: Path, scored: int | None, refused: bool) -> None:
    # clients 1, 2, 3 get no test images: eval.clients of 3 or fewer may draw only them (a ZeroDivisionError in
    # the strategy's aggregate_evaluate at that round, before); of all 4, never
    experiment = resolve(config(tmp_path, partition=f"{HERE}:NoTestButFirst", eval={"clients": scored}))
    if refused:
        with pytest.raises(DataError, match=r"no test images .*\(eval\.clients\)"):
            experiment.federation()
    else:
        assert [len(p) > 0 for p in experiment.federation().partition.test] == [True, False, False, False]


def test_a_dataset_a_run_cannot_learn_from_is_refused_naming_it(tmp_path: Path) -> None:
    experiment = resolve(config(tmp_path, data={"dataset": f"{HERE}:OneClass"}, partition="iid"))
    with pytest.raises(DataError, match=r"^dataset 'one'"):
        experiment.federation()


# --- the model -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "inputs", "classes"),
    [({}, 1 * 28 * 28, 10), ({"dataset": f"{HERE}:Small"}, 3 * 4 * 4, 3)],  # MNIST's 28x28 grey; Small's 4x4 RGB
)
def test_the_model_is_built_for_the_datasets_classes_and_image_shape(
    tmp_path: Path, data: dict[str, Any], inputs: int, classes: int
) -> None:
    cfg = config(tmp_path, data=data, partition="iid", train={"num_clients": 3}, model={"hidden": [32]})
    model = resolve(cfg).build_model()
    assert type(model) is MODELS.get("mlp")
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes == {
        "fcs.0.weight": (32, inputs),
        "fc_norms.0.weight": (32,),  # LN's affine parameters
        "fc_norms.0.bias": (32,),
        "classifier.weight": (classes, 32),  # model.bias: false
    }


def test_the_initial_model_depends_on_the_seed_alone(tmp_path: Path) -> None:
    experiment = resolve(config(tmp_path, seed=3))
    torch.manual_seed(11)
    first = experiment.initial_model().state_dict()
    torch.rand(100)  # the global generator moved on
    again = experiment.initial_model().state_dict()
    torch.manual_seed(3)  # the recipe's model, drawn here from the seed
    expected = experiment.model.create(10, (1, 28, 28), experiment.normaliser).state_dict()
    assert list(first) == list(expected)
    assert all(torch.equal(first[k], again[k]) and torch.equal(first[k], expected[k]) for k in expected)
    other = resolve(config(tmp_path, seed=4)).initial_model().state_dict()
    assert not torch.equal(other["fcs.0.weight"], first["fcs.0.weight"])


def test_the_run_model_is_the_one_the_strategy_adapts_the_recipes_into(tmp_path: Path) -> None:
    ADAPTED.clear()
    experiment = resolve(config(tmp_path, seed=7, strategy=f"{HERE}:AdaptsToACopy"))
    model = experiment.initial_model()
    ((given, returned, seed),) = ADAPTED
    assert model is returned and model is not given and seed == 7
    assert not model.classifier.weight.any() and given.classifier.weight.any()


def test_an_adapt_model_that_returns_no_model_is_refused_naming_the_strategy(tmp_path: Path) -> None:
    experiment = resolve(config(tmp_path, strategy=f"{HERE}:AdaptsToNone"))
    with pytest.raises(ConfigError, match=r"^strategy: 'tests\.test_resolve:AdaptsToNone'") as err:
        experiment.build_model()
    assert "adapt_model" in str(err.value) and "NoneType" in str(err.value)


def test_a_strategys_own_fedsim_error_passes_as_it_is(tmp_path: Path) -> None:
    experiment = resolve(config(tmp_path, strategy=f"{HERE}:AdaptRefuses"))
    with pytest.raises(DataError, match="at least 20 classes") as err:
        experiment.build_model()
    assert err.value.__cause__ is None  # not wrapped


# --- the strategy ----------------------------------------------------------------------------------------------


def test_the_server_half_is_the_strategys_built_from_the_setup(tmp_path: Path) -> None:
    SETUPS.clear()
    setup = ServerSetup(4, frozenset({"fcs.0.weight", "classifier.weight"}), seed=2)
    server = build_server(resolve(config(tmp_path, strategy=f"{HERE}:ServerRecords")), setup)
    assert isinstance(server, FedAvg) and server.fraction_evaluate == 0.0
    assert SETUPS == [setup]


def test_a_server_half_that_raises_is_a_config_error_naming_the_strategy(tmp_path: Path) -> None:
    experiment = resolve(config(tmp_path, strategy=f"{HERE}:ServerRaises"))
    with pytest.raises(ConfigError, match=r"^strategy: 'tests\.test_resolve:ServerRaises' raised KeyError") as err:
        build_server(experiment, ServerSetup(4, frozenset()))
    assert isinstance(err.value.__cause__, KeyError) and "server_lr" in str(err.value)


def raising(err: Exception) -> Callable[[], None]:
    def call() -> None:
        raise err

    return call


def test_a_strategy_call_returns_its_value_or_names_the_strategy_in_one_line(tmp_path: Path) -> None:
    experiment: Experiment = resolve(config(tmp_path, strategy={"name": "FedAvg"}))
    assert call_strategy(experiment, "counting", lambda: 42) == 42
    bug = ValueError("no  model\n\there,\n   really ")
    with pytest.raises(ConfigError) as err:
        call_strategy(experiment, "counting its layers", raising(bug))
    said = str(err.value)
    assert said.startswith("strategy: 'FedAvg'")  # as the config spells it
    assert "ValueError" in said and "counting its layers" in said and said.endswith("no model here, really")
    assert "\n" not in said and err.value.__cause__ is bug
    refusal = DataError("data: not this one")
    with pytest.raises(DataError) as passed:
        call_strategy(experiment, "counting", raising(refusal))
    assert passed.value is refusal
