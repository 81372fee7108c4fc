"""The strategy contract (:class:`StrategySpec`: a server half, a client half and the protocol rows of its own)
and its registry, with stock Flower strategies wrapped as specs; :mod:`fedsim.strategies` says how a strategy
is made.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Annotated, Any, ClassVar

from flwr.serverapp.strategy import Strategy
from pydantic import Field, TypeAdapter, create_model
from pydantic.errors import PydanticInvalidForJsonSchema, PydanticSchemaGenerationError

from fedsim import wire
from fedsim.errors import RegistryError, brief
from fedsim.models import FedsimModel
from fedsim.registry import Entry, PluginParams, Registry
from fedsim.strategies.aggregation import FastAveraging
from fedsim.strategies.hooks import ClientHooks
from fedsim.strategies.server_half import EVERY_NODE, ServerSetup


class StrategySpec:
    """Base of every registered strategy. The class docstring's first paragraph is its summary.

    The defaults are FedAvg's halves: a strategy that only changes the client sets ``Client``;
    one whose server takes options or differs overrides :meth:`server`. A strategy that puts records or
    keys of its own into Messages or into a client's ``Context.state`` declares each in ``protocol``
    (``docs/protocol.md`` lists them under its name); none may reuse a name of the core's (``fedsim.wire``).
    """

    Params = PluginParams
    Client: ClassVar[type[ClientHooks]] = ClientHooks
    protocol: ClassVar[tuple[wire.Key, ...]] = ()
    # its options read only by a personalisation of its own: refused with personalised evaluation off
    personal_options: ClassVar[frozenset[str]] = frozenset()
    params: Any

    def __init__(self, params: PluginParams) -> None:
        self.params = params

    def server(self, setup: ServerSetup) -> Strategy:
        """The server half: a Flower strategy (fedsim's round loop samples clients and evaluates)."""
        return FastAveraging(**EVERY_NODE)

    def client(self) -> ClientHooks:
        """The client half: a fresh hooks object (one per model a worker trains)."""
        return self.Client(self.params)

    def adapt_model(self, model: FedsimModel, seed: int) -> FedsimModel:
        """The run's model as this strategy trains it, from the recipe's ``model`` and the run's ``seed``: the same
        on the server and every client (FedETF swaps the classifier for its fixed ETF). By default ``model``."""
        return model

    def fine_tunes(self) -> bool:
        """Whether personalised evaluation fine-tunes this strategy's model generically, reading
        ``eval.personal.steps``, ``params`` and ``lr`` (:meth:`ClientHooks.personalize`'s default, which an override
        may still call); a strategy whose client half personalises its own way, reading none of them, returns False
        (FedRoD's personal head), and those options are then refused as a measurement believed made."""
        return True


class FlowerStrategySpec(StrategySpec):
    """A stock Flower strategy, with FedAvg's client half; ``strategy_class`` is set per wrapped class."""

    strategy_class: ClassVar[type[Strategy]]

    def server(self, setup: ServerSetup) -> Strategy:
        return self.strategy_class(**self.params.model_dump(exclude_unset=True))


# The ranges Flower's strategies need but their signatures do not state (Flower checks only
# FedTrimmedAvg's beta, and only once built), by constructor argument: a wrapped class's argument of
# one of these names that a Flower class in its MRO takes gets the range, so a bad value is a config
# error naming the field, not NaN weights (or a silent ascent) rounds later.
FLOWER_RANGES: dict[str, dict[str, float]] = {
    "fraction_train": {"ge": 0, "le": 1},  # fractions of the nodes
    "fraction_evaluate": {"ge": 0, "le": 1},
    "min_train_nodes": {"ge": 0},  # numbers of nodes
    "min_evaluate_nodes": {"ge": 0},
    "min_available_nodes": {"ge": 0},
    "eta": {"gt": 0},  # FedOpt's server learning rate: a negative one ascends the loss
    "eta_l": {"gt": 0},  # FedOpt's client learning rate (documented; Flower's server never reads it)
    "beta_1": {"ge": 0, "lt": 1},  # FedAdam divides by 1 - beta_1^t
    "beta_2": {"ge": 0, "lt": 1},  # v >= 0 (√v is taken) needs beta_2 <= 1; FedAdam's step is 0 at 1
    "tau": {"gt": 0},  # v starts at 0: m / (√v + tau) is 0/0 on a tensor that did not move
    "proximal_mu": {"ge": 0},  # a negative μ rewards drifting from the global model
    "server_learning_rate": {"gt": 0},  # FedAvgM
    "server_momentum": {"ge": 0, "lt": 1},  # FedAvgM's momentum buffer grows without bound at >= 1
    "beta": {"ge": 0, "lt": 0.5},  # FedTrimmedAvg's cut fraction from each tail (its own check)
    "q": {"ge": 0},  # QFedAvg's fairness exponent (0: FedAvg); its h weights need q >= 0
    "client_learning_rate": {"gt": 0},  # QFedAvg's L = 1 / client_learning_rate
    "num_malicious_nodes": {"ge": 0},  # Krum, MultiKrum, Bulyan
    "num_nodes_to_select": {"ge": 1},  # MultiKrum
}


def _flower_arguments(cls: type) -> set[str]:
    """The constructor arguments of the classes from the ``flwr`` package in ``cls``'s MRO."""
    return {
        name
        for base in cls.__mro__
        if base.__module__.startswith("flwr.")
        for name in inspect.signature(base.__init__).parameters
    }


def _numeric(hint: Any) -> bool:
    """``int``, ``float``, or an optional one (``float | None``)."""
    members = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
    return bool(members & {int, float}) and members <= {int, float, type(None)}


def _configurable(hint: Any) -> bool:
    """Whether a config can give a value of type ``hint``: it has a JSON form (not a Strategy, a callable...)."""
    try:
        TypeAdapter(hint).json_schema()
    except (PydanticInvalidForJsonSchema, PydanticSchemaGenerationError):
        return False
    return True


def wrap_flower_strategy(obj: object) -> type[StrategySpec] | None:
    """A spec for a Flower ``Strategy`` class, whose ``Params`` are its constructor's keyword arguments.

    An argument a config cannot give (no JSON form: a callable, an accountant) keeps its default and is no
    option; a class that needs one (Flower's differential-privacy wrappers take the strategy they wrap) is
    refused, naming it.
    """
    if not (isinstance(obj, type) and issubclass(obj, Strategy)):
        return None
    try:
        hints = typing.get_type_hints(obj.__init__)
    except Exception:  # an annotation that does not resolve: accept any value for it
        hints = {}
    flower_args = _flower_arguments(obj)
    fields: dict[str, Any] = {}
    for name, p in inspect.signature(obj.__init__).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        hint = hints.get(name, Any)
        if not _configurable(hint):
            if p.default is inspect.Parameter.empty:
                raise RegistryError(
                    f"{obj.__qualname__} needs {name!r} ({getattr(hint, '__name__', hint)}), which a config cannot "
                    "give: build it in a Strategy subclass of your own and name that"
                )
            continue
        if name in FLOWER_RANGES and name in flower_args and _numeric(hint):
            hint = Annotated[hint, Field(**FLOWER_RANGES[name])]
        fields[name] = (hint, ... if p.default is inspect.Parameter.empty else p.default)
    params = create_model(f"{obj.__name__}Params", __base__=PluginParams, **fields)  # fedsim's rules for options
    doc = (obj.__doc__ or "").strip().splitlines()
    summary = f"Flower's {obj.__name__}: {doc[0] if doc else ''} (FedAvg's client half)"
    return type(
        f"Flower{obj.__name__}Spec",
        (FlowerStrategySpec,),
        {"Params": params, "strategy_class": obj, "__doc__": summary, "__module__": __name__},
    )


def declaring_class(cls: type[StrategySpec]) -> type[StrategySpec]:
    """The class in ``cls``'s MRO whose body sets ``protocol``: a subclass that inherits its rows repeats no one's."""
    return next(c for c in cls.__mro__ if "protocol" in vars(c))


def own_name(row: wire.Key) -> str:
    """The name a strategy's row gives the wire: its record's, or its key's in a record of the core's."""
    return row.key if row.record in wire.CORE_RECORDS else row.record


def check_protocol(name: str, cls: type[StrategySpec], registered: list[Entry[StrategySpec]]) -> None:
    """Refuse a strategy whose ``protocol`` is not a tuple of :class:`~fedsim.wire.Key` rows, or has a row that
    uses a name of the core's protocol (:data:`~fedsim.wire.CORE_NAMES`) as its record or key, takes a whole
    record of the core's, repeats one of its own rows, or names a record or key another registered strategy
    declares (one that is not its subclass or base: a SCAFFOLD subclass may send ``scaffold.c``): one line naming
    the strategy and the key."""
    path = f"{cls.__module__}:{cls.__qualname__}"
    owner = f"strategy {name!r}" + ("" if name == path else f" ({path})")
    rows = cls.protocol
    if not isinstance(rows, tuple) or not all(isinstance(row, wire.Key) for row in rows):
        raise RegistryError(f"{owner}: protocol must be a tuple of fedsim.wire.Key rows, got {brief(rows)}")
    mine = declaring_class(cls)
    others = {
        own_name(k): entry.name
        for entry in registered
        if not (issubclass(mine, theirs := declaring_class(entry.obj)) or issubclass(theirs, mine))
        for k in entry.obj.protocol
    }
    seen: set[tuple[str, str, str, str]] = set()
    for row in rows:
        row_text = f"its protocol key {row.key!r} (record {row.record!r}, message {row.message!r})"
        taken = sorted((({row.record} - wire.CORE_RECORDS) | ({row.key} - wire.PLACEHOLDERS)) & wire.CORE_NAMES)
        if taken or own_name(row) in wire.PLACEHOLDERS:
            what = f"reuses the name {taken[0]!r}" if taken else f"is every entry of the record {row.record!r}"
            raise RegistryError(
                f"{owner}: {row_text} {what} of fedsim's core protocol (fedsim/wire.py, docs/protocol.md): give "
                "the strategy's records and keys names of their own"
            )
        if own_name(row) in others:
            raise RegistryError(f"{owner}: {row_text} is declared by strategy {others[own_name(row)]!r} too")
        where = (row.message, row.direction, row.record, row.key)
        if where in seen:
            raise RegistryError(f"{owner}: {row_text} is declared twice")
        seen.add(where)


STRATEGIES: Registry[StrategySpec] = Registry(
    "strategies", StrategySpec, adapt=wrap_flower_strategy, check=check_protocol
)
