"""One experiment, resolved once: the typed objects a run is made of.

:func:`resolve` turns a :class:`~fedsim.config.RunConfig` into an :class:`Experiment`: the dataset
loader, the partitioner, the normaliser, the model recipe and the strategy, each looked up in its
registry with its options validated against its ``Params``. This is the one place plugin options
are validated. The server, the clients, the diagnostics and the benchmarks all take the Experiment;
each process resolves a config once (cached by the config's JSON).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import torch
from flwr.serverapp.strategy import Strategy

from fedsim.config import PersonalEvalConfig, RunConfig
from fedsim.config_file import load_config
from fedsim.data import DATASETS, DatasetLoader
from fedsim.data.base import check_classes
from fedsim.data.generated import GeneratedLoader
from fedsim.errors import ConfigError, FedsimError
from fedsim.experiment.federation import AnyFederation, load_federation
from fedsim.models import MODELS, FedsimModel
from fedsim.models.size import check_size
from fedsim.norms import NORMS, Normaliser
from fedsim.partitions import PARTITIONERS, Partitioner
from fedsim.partitions.base import check_participation
from fedsim.registry import Resolved
from fedsim.strategies import STRATEGIES, StrategySpec
from fedsim.strategies.server_half import ServerSetup

T = TypeVar("T")

@dataclass(frozen=True, eq=False)
class Experiment:
    """A run config with every plugin resolved: what the server, the clients and the tools share."""

    config: RunConfig
    loader: DatasetLoader
    partitioner: Partitioner
    normaliser: Normaliser
    model: Resolved[FedsimModel]
    strategy: StrategySpec

    def federation(self) -> AnyFederation:
        """The dataset and its split (decoded and split once per process), refused if a run cannot learn from
        it and score it or a round may train nothing (:func:`fedsim.data.base.check_classes`,
        :func:`fedsim.partitions.base.check_participation`), or if ``data.normalize`` would divide by a channel's
        std under one grey level (:attr:`Federation.channel_stats`). A dataset generated per client is its own
        federation (checked with the config: :func:`check_generated`)."""
        fed = load_federation(self.config, self.loader, self.partitioner)
        if fed.dataset is not None:
            check_classes(fed.dataset)
            train, n = self.config.train, self.config.train.num_clients
            check_participation(fed.partition, train.clients_per_round or n, self.config.eval.clients or n)
            if self.config.data.normalize:
                fed.input_transform(normalize=True)  # the channels' statistics, computed once, here
        return fed

    def build_model(self) -> FedsimModel:
        """A fresh model for the dataset's classes and image shape (weights from torch's global RNG), once this
        machine can hold it (:func:`fedsim.models.size.check_size`: counted before any weight is allocated)."""
        fed = self.federation()
        check_size(self.model, fed.num_classes, fed.in_shape, self.normaliser)
        model = self.model.create(fed.num_classes, fed.in_shape, self.normaliser)
        adapted = call_strategy(self, "adapting the model", lambda: self.strategy.adapt_model(model, self.config.seed))
        if not isinstance(adapted, FedsimModel):
            raise ConfigError(
                f"strategy: {self.config.strategy.name!r}: adapt_model returned a {type(adapted).__name__}, not the "
                "model it was given (a FedsimModel)"
            )
        return adapted

    def initial_model(self) -> FedsimModel:
        """The run's initial global model: the same weights for the same seed, in any process."""
        torch.manual_seed(self.config.seed)
        return self.build_model()


def build_server(experiment: Experiment, setup: ServerSetup) -> Strategy:
    """The strategy's server half; a plugin's ``server()`` that raises is a config error naming it."""
    return call_strategy(experiment, "building its server half", lambda: experiment.strategy.server(setup))


def call_strategy(experiment: Experiment, doing: str, call: Callable[[], T]) -> T:
    """``call``, a method of the run's strategy spec: one that raises is a config error naming the plugin."""
    try:
        return call()
    except FedsimError:
        raise
    except Exception as err:
        name = experiment.config.strategy.name
        why = " ".join(str(err).split())
        raise ConfigError(f"strategy: {name!r} raised {type(err).__name__} {doing}: {why}") from err


def resolve(cfg: RunConfig) -> Experiment:
    """``cfg``'s plugins, looked up and validated; errors name the YAML field and what is allowed."""
    return _resolve(cfg.to_json())


@lru_cache(maxsize=8)
def _resolve(config_json: str) -> Experiment:
    cfg = RunConfig.from_json(config_json)
    partitioner = PARTITIONERS.resolve(cfg.partition.name, cfg.partition.options, "partition").create()
    partitioner.check_clients(cfg.train.num_clients)
    loader = DATASETS.resolve(cfg.data.dataset.name, cfg.data.dataset.options, "data.dataset").create()
    check_generated(cfg, loader)
    strategy = STRATEGIES.resolve(cfg.strategy.name, cfg.strategy.options, "strategy").create()
    check_personalisation(cfg, strategy)
    return Experiment(
        config=cfg,
        loader=loader,
        partitioner=partitioner,
        normaliser=NORMS.resolve(cfg.model.norm.name, cfg.model.norm.options, "model.norm").create(),
        model=MODELS.resolve(cfg.model.name, cfg.model.options, "model"),
        strategy=strategy,
    )


def check_personalisation(cfg: RunConfig, strategy: StrategySpec) -> None:
    """Refuse what personalised evaluation would not read, as a measurement believed made: a strategy's options
    read only by its own personalisation with ``eval.personal`` off, and the fine-tuning's ``steps`` (above 0),
    ``params`` and ``lr`` for a strategy that personalises its own way (FedRoD's personal head, FedETF's local
    adaptation), and ``params`` and ``lr`` beside ``steps: 0`` for one that fine-tunes."""
    personal, name = cfg.eval.personal, cfg.strategy.name
    if personal.steps is None:
        if given := sorted(strategy.personal_options & set(cfg.strategy.options)):
            raise ConfigError(
                f"strategy.{given[0]} is read only by {name}'s personalisation, which eval.personal.steps: null "
                f"(personalised evaluation off) never runs: set eval.personal.steps: 0 to run it, or remove "
                f"strategy.{given[0]}"
            )
        return
    defaults = PersonalEvalConfig()
    tuning = {k: getattr(personal, k) for k in ("params", "lr") if getattr(personal, k) != getattr(defaults, k)}
    if strategy.fine_tunes():
        if personal.steps == 0 and tuning:  # no fine-tuning step to read them
            key, value = next(iter(tuning.items()))
            raise ConfigError(
                f"eval.personal.{key} = {value!r}: eval.personal.steps is 0, so no fine-tuning step reads it: give "
                f"eval.personal.steps above 0, or remove eval.personal.{key}"
            )
        return
    given = ({"steps": personal.steps} if personal.steps else {}) | tuning
    if given:
        key, value = next(iter(given.items()))
        fix = "give eval.personal.steps: 0 (personalised evaluation on)" if key == "steps" else "remove it"
        raise ConfigError(
            f"eval.personal.{key} = {value!r}: strategy {name!r} personalises its own way, reading none of "
            f"eval.personal's steps, params and lr (docs/algorithms.md): {fix}, or choose a strategy that fine-tunes"
        )


def check_generated(cfg: RunConfig, loader: DatasetLoader) -> None:
    """A dataset generated per client (:mod:`fedsim.data.generated`) with what it can serve, before any data is
    drawn: its own partition (``natural``, which nothing else takes), no whole test set, no probe batch and, for
    feature vectors, no image augmentation or per-channel normalisation."""
    name, natural = cfg.data.dataset.name, cfg.partition.name == "natural"
    if not isinstance(loader, GeneratedLoader):
        if natural:
            raise ConfigError(
                "partition: 'natural' takes each client's own samples from a dataset generated per client "
                f"(synthetic); data.dataset {name!r} is one dataset split by a partitioner: dirichlet, n_class, "
                "iid, ... (fedsim list partitions)"
            )
        return
    what = f"data.dataset {name!r} is generated per client"
    if not natural:
        raise ConfigError(f"partition: {cfg.partition.name!r} splits a loaded dataset; {what}: give partition: natural")
    d = cfg.diagnostics
    refused = {
        "eval.global_test: true": (cfg.eval.global_test, "it has no whole test set (each client's test split counts)"),
        "diagnostics: a probe batch": (
            d.features or d.isometry or d.grad_norms or d.probe_size is not None,
            "the probe is the first test images of a whole test set, which it has not",
        ),
        "data.augment: true": (cfg.data.augment and not loader.images, "its samples are feature vectors, not images"),
        "data.normalize: true": (cfg.data.normalize, "its statistics would need every client's samples"),
    }
    for field, (given, why) in refused.items():
        if given:
            raise ConfigError(f"{field}: {what} and {why}; turn it off")


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Read, override, validate and resolve a config file: everything checkable without data."""
    return resolve(load_config(path, overrides))
