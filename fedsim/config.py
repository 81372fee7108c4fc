"""The run configuration: one YAML file, validated by pydantic before anything starts.

The sections are typed here. Plugins (the dataset, the partitioner, the model, its normaliser, the
strategy) are written one way, ``{name: ..., <options>}`` or just the name (:class:`PluginBlock`);
their options belong to the plugin and are validated against its own ``Params`` once, by
:func:`fedsim.experiment.resolve`, so this module imports no plugin.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, to_jsonable_python

from fedsim.errors import ConfigError, FedsimWarning, brief, one_line
from fedsim.names import NAME_RULE, is_name, printable
from fedsim.ownership import unusable
from fedsim.paths import home_expanded, package_path, resolve_path
from fedsim.reading import CONFIG_BYTES, check_source, read_text
from fedsim.registry import Float32Options, all_floats, number_as_text


class DeprecatedConfig(FedsimWarning, FutureWarning):
    """A config form fedsim still reads but will stop reading; the message names the new form."""


# a path in a config or sweep file that fedsim writes to or reads as given: ~ is the home directory
HomePath = Annotated[str, AfterValidator(home_expanded)]


class _Strict(Float32Options):
    # unknown keys are errors; an inf or NaN in a float option is never a setting anyone meant (nor a float beyond
    # float32's range: Float32Options); and pydantic's
    # strict mode: a boolean or a string is never a number (``true`` is not 1, ``'0.1'`` not 0.1), an int still
    # is a float (plugin options get the same from fedsim.registry.validate_options)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    _printable = field_validator("*")(printable)  # no control character in a name, a path or an address


class PluginBlock(BaseModel):
    """``{name: ..., <options>}``, or just the name: a plugin and its options (checked by its registry)."""

    model_config = ConfigDict(extra="allow")
    name: str
    _printable = field_validator("name")(printable)

    @model_validator(mode="before")
    @classmethod
    def _name_alone(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _plain_options(self) -> PluginBlock:
        for key, value in (self.model_extra or {}).items():
            try:  # fedsim.experiment.resolve passes them through JSON (an API caller's mapping may hold anything)
                json.dumps(to_jsonable_python(value))
            except ValueError:  # an int of more than 4,300 digits, an object JSON has no form for, a list in itself
                raise PydanticCustomError(
                    "json_value",
                    "option {key} = {value} has no form in the run's config.yaml: give text, a number, true/false, "
                    "null, or a list or mapping of them",
                    {"key": key, "value": brief(value)},
                ) from None
            # the plugin's Params refuse inf and NaN too, but only after a trip through JSON turned them into null
            if not all_floats(value, math.isfinite):
                raise PydanticCustomError("finite_number", "option {key} = {value} is not a finite number",
                                          {"key": key, "value": value})  # fmt: skip
        printable(self.model_extra)
        return self

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class DataConfig(_Strict):
    dataset: PluginBlock = Field(description="the dataset loader (fedsim list datasets) and its options")
    root: str = Field("", description="file or directory the loader reads; relative to the config file")
    download: bool = Field(False, description="let torchvision download missing files")
    augment: bool = Field(True, description="random crop (pad 4) + horizontal flip on training batches")
    normalize: bool = Field(False, description="per-channel mean/std input normalisation (paper: off)")
    cache_dir: str | None = Field(None, description="where decoded image archives are cached")


class ModelBlock(PluginBlock):
    """``model: {name: cnn, norm: {name: gn, groups: 2}, <the model's options>}``."""

    name: str = "cnn"
    norm: PluginBlock = Field(default_factory=lambda: PluginBlock(name="none"))

    @model_validator(mode="before")
    @classmethod
    def _deprecated_args(cls, value: Any) -> Any:
        """The pre-0.2 forms ``model.args`` and ``model.norm_args``, read with a warning naming the new one."""
        if not isinstance(value, dict) or not ({"args", "norm_args"} & value.keys()):
            return value
        value = dict(value)
        args, norm_args = value.pop("args", None) or {}, value.pop("norm_args", None) or {}
        if args:
            value = _merged(value, args, "model.args")
            _deprecated("model.args", "model", {k: v for k, v in value.items() if k != "norm"})
        if norm_args:
            norm = value.get("norm", "none")
            value["norm"] = _merged({"name": norm} if isinstance(norm, str) else norm, norm_args, "model.norm_args")
            _deprecated("model.norm_args", "model.norm", value["norm"])
        return value


def _merged(block: Any, options: Any, old: str) -> dict[str, Any]:
    if not isinstance(options, dict) or not isinstance(block, dict):
        raise ValueError(f"{old} must be a mapping of options")
    if clash := sorted(options.keys() & block.keys()):
        raise ValueError(f"{old} repeats {', '.join(clash)}: give each option once, beside the name")
    return {**block, **options}


def _deprecated(old: str, new: str, block: dict[str, Any]) -> None:
    shown = yaml.safe_dump(block, default_flow_style=True, sort_keys=False, width=10**6).strip()
    warnings.warn(f"{old} is deprecated and will be removed: write {new}: {shown}", DeprecatedConfig, stacklevel=2)


DEFAULT_LOCAL_STEPS = 10  # LN-FL's K (App. C.3)
# the longest wait a config may ask for: longer is never meant, and Python's own waits overflow near 9.2e9 s
# (threading.TIMEOUT_MAX: a round_timeout_s of 1e30 was an OverflowError traceback)
MAX_WAIT_S = 7 * 24 * 3600.0
MAX_LOCAL_STEPS = 10**6  # a round's K, and fedsim local's --steps: days of SGD at the paper's scale


class TrainConfig(_Strict):
    rounds: int = Field(100, ge=1, le=10**7)
    num_clients: int = Field(10, ge=1, le=10**6)
    clients_per_round: int | None = Field(
        None, ge=1, description="clients sampled each round (fedsim's seeded sampler); default all"
    )
    local_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_LOCAL_STEPS,
        description="K mini-batch SGD steps per round (the paper's E); 10 unless local_epochs",
    )
    local_epochs: int | None = Field(None, ge=1, le=10**4, description="epoch-based local work instead of steps")
    batch_size: int = Field(32, ge=1, description="mini-batch size; at most the training set's size")
    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    on_client_failure: Literal["fail", "skip"] = Field(
        "fail",
        description="a client that errors or misses round_timeout_s: stop the run (fail) or aggregate the "
        "replies that arrived and record the missing partitions in metrics.jsonl (skip)",
    )
    round_timeout_s: float = Field(
        3600.0,
        gt=0,
        le=MAX_WAIT_S,
        description="the longest each phase of a round may take, under every engine: the clients' replies "
        "(SuperNodes', Ray workers': a client whose reply misses it has failed; inline clients' work: one that "
        "overruns stops the run, whatever on_client_failure) and each call of a strategy's server hooks (one that "
        "overruns stops the run)",
    )
    max_loss: float | None = Field(
        1e6, gt=0, description="a mean training loss above this stops the run as diverged (cross-entropy starts "
        "near ln(classes)); null: only NaN / inf do"
    )

    @model_validator(mode="after")
    def _participation(self) -> TrainConfig:
        if self.clients_per_round is not None and self.clients_per_round > self.num_clients:
            raise ValueError(
                f"train.clients_per_round = {self.clients_per_round} must be in 1..num_clients "
                f"({self.num_clients})"
            )
        if self.local_epochs is not None and self.local_steps is not None:
            raise ValueError(
                f"train.local_steps = {self.local_steps} and train.local_epochs = {self.local_epochs} are both set: "
                "local work is counted in steps or in epochs; remove one"
            )
        if self.local_epochs is None and self.local_steps is None:
            self.local_steps = DEFAULT_LOCAL_STEPS
        return self


class EvalConfig(_Strict):
    every: int = Field(10, ge=1, description="evaluate every k rounds (and after the last)")
    batch_size: int = Field(
        500, ge=1, description="images whose loss is summed at once (the forward pass runs in chunks of 50 inside it)"
    )
    global_test: bool = Field(True, description="also evaluate the global model on the whole test set")


class ClientResources(_Strict):
    num_cpus: float = Field(1.0, gt=0)
    num_gpus: float = Field(0.0, ge=0)


THREADS_PER_CPU = 4  # simulation.threads' bound, in CPUs of the machine
RAY_PROBE_TIMEOUT_S = 10.0  # the most simulation.ray_address's check waits for a Ray cluster to answer
# validation context: a run directory's config read back (fedsim report, plot), not run on this machine
READ_BACK = "read_back"


class SimulationConfig(_Strict):
    backend: Literal["auto", "inline", "ray"] = Field(
        "auto",
        description="engine local: clients in this process (inline) or on a Ray actor pool; auto: the pool when "
        "this machine has 2+ cores and a round 2+ clients on the CPU (or ray_address is set), else inline "
        "(fedsim.engines.layout)",
    )
    client_resources: ClientResources = Field(default_factory=ClientResources)
    ray_address: str | None = Field(
        None,
        pattern=r"^(auto|(ray://)?[^\s/]+:\d+)$",
        description="join an existing Ray cluster: auto, host:port (GCS) or ray://host:port (Ray Client); checked "
        f"before the run starts: a Ray of this Ray and Python version must answer there within {RAY_PROBE_TIMEOUT_S:g} "
        "s; unset: a Ray instance of this process alone, every server on 127.0.0.1",
    )
    device: Literal["cpu", "cuda"] = "cpu"
    threads: int | Literal["auto"] = Field(
        "auto",
        description="torch intra-op threads per process that trains clients; auto: every core inline, "
        f"client_resources.num_cpus (at least 1) per Ray worker or SuperNode; at most {THREADS_PER_CPU} x the "
        "CPUs of the machine that reads the config",
    )

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, threads: Any, info: ValidationInfo) -> Any:
        # Bounded by the machine: threads beyond its cores only wait on each other, and torch crashes on a
        # million (SIGSEGV); a few times the cores stays allowed, for measuring oversubscription. A run directory's
        # config read back (READ_BACK) runs nowhere here: a larger machine's threads are its own.
        cpus = os.cpu_count() or 1
        bound = threads if (info.context or {}).get(READ_BACK) and type(threads) is int else THREADS_PER_CPU * cpus
        if threads == "auto" or (type(threads) is int and 1 <= threads <= bound):
            return threads
        raise ValueError(
            f"simulation.threads = {brief(threads)}: give auto or a whole number of threads in "
            f"1..{THREADS_PER_CPU * cpus} ({THREADS_PER_CPU} x this machine's {cpus} CPUs)"
        )

    state_memory_mb: float = Field(
        512.0, gt=0, description="engine local: client state (SCAFFOLD's c_i, FedBN's local tensors) a worker "
        "pool keeps in memory; beyond it, the least recently used clients' state waits on disk"
    )
    vmap_clients: int = Field(
        1,
        ge=1,
        description="engine local: train up to this many of a worker's clients of a round at once "
        "(torch.func.vmap over their stacked parameters; train.local_steps, norms without running "
        "statistics); 1 = one client at a time",
    )


class OutputConfig(_Strict):
    dir: HomePath = Field("runs", description="parent of the run directories")
    run_dir: HomePath | None = Field(None, description="exact run directory (default <dir>/<name>-<time>)")
    trackers: list[PluginBlock] = Field(
        default_factory=list,
        description="experiment trackers that also get the config, every round's numbers and the run's files: "
        "tensorboard, mlflow (pip install 'fedsim[mlflow]'), wandb (offline; pip install 'fedsim[wandb]'), or "
        "package.module:Class (fedsim list trackers); each once",
    )
    save_model: bool = True
    progress: bool = True
    checkpoint_every: int = Field(
        0,
        ge=0,
        description="write checkpoint.pt (model, strategy and client state, RNG, metrics) every k rounds "
        "(1..train.rounds), for `fedsim run --resume RUN_DIR`; 0 = off",
    )

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_flag(cls, value: Any) -> Any:
        """The pre-0.2 ``output.tensorboard: true``, read as the tracker it now is, with a warning naming it;
        ``false`` (in run directories written then) is dropped."""
        if not isinstance(value, dict) or "tensorboard" not in value:
            return value
        value = dict(value)
        if value.pop("tensorboard") is True:
            trackers = value.get("trackers") or []
            value["trackers"] = [*trackers, "tensorboard"] if isinstance(trackers, list) else trackers
            warnings.warn("output.tensorboard is deprecated and will be removed: write output.trackers: [tensorboard]",
                          DeprecatedConfig, stacklevel=2)  # fmt: skip
        return value


class CertificatesConfig(_Strict):
    """PEM files for TLS: the CA that signed the SuperLink's certificate, the certificate and its key."""

    ca: HomePath
    cert: HomePath
    key: HomePath


class DeployConfig(_Strict):
    """``fedsim deploy`` and ``fedsim compose``: a real Flower SuperLink and one SuperNode per client."""

    address: str = Field("127.0.0.1", description="the only address the SuperLink listens on")
    port: int = Field(0, ge=0, le=65535, description="the SuperLink's port (0: a free one, fedsim deploy only)")
    tls: bool = Field(False, description="TLS between SuperNodes, the CLI and the SuperLink")
    certificates: CertificatesConfig | None = Field(
        None, description="given PEM files; with tls and none given, fedsim makes a local CA and certificates"
    )
    supernode_auth: bool = Field(
        False, description="the SuperLink accepts only SuperNodes whose public keys were registered"
    )
    startup_timeout_s: float = Field(
        120.0, gt=0, le=MAX_WAIT_S, description="how long to wait for the SuperLink to listen"
    )
    private_network: bool = Field(
        True, description="fedsim deploy on a loopback address: the run in a network namespace of its own, where "
        "no other local process reaches the SuperLink's unauthenticated Control API",
    )

    @field_validator("address")
    @classmethod
    def _ip_literal(cls, address: str) -> str:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(
                f"deploy.address = {address!r}: give an IP address of this host, e.g. 127.0.0.1, 0.0.0.0 (every "
                "interface), 10.0.0.5 or ::1; SuperNodes on other hosts reach it by name with fedsim compose "
                "--superlink-host"
            ) from None
        return address

    @model_validator(mode="after")
    def _certificates_need_tls(self) -> DeployConfig:
        if self.certificates is not None and not self.tls:
            raise ValueError("deploy.certificates is given but deploy.tls is false: set deploy.tls: true")
        if self.supernode_auth and not self.tls:  # the SuperLink refuses to start (exit 104): say so first
            raise ValueError(
                "deploy.supernode_auth is true but deploy.tls is false: SuperNode authentication needs TLS; "
                "set deploy.tls: true"
            )
        return self


PROBE_SIZE = 256  # the probe batch when diagnostics.probe_size is not given (and the test set holds as many)


class DiagnosticsConfig(_Strict):
    """What ``fedsim.diagnostics`` measures on a fixed probe batch at each evaluation (all off: free)."""

    features: bool = Field(
        False, description="penultimate-feature singular values, effective rank, feature and class norms"
    )
    isometry: bool = Field(False, description="isometry I(G) of the features entering each linear / conv layer")
    grad_norms: bool = Field(False, description="gradient norm per parameter of the initial model (first line)")
    probe_size: int | None = Field(
        None, ge=2, description=f"the probe batch: the first probe_size test images (null: {PROBE_SIZE}, or the "
        "whole test set when it is smaller; a size the test set cannot give is refused)",
    )
    isometry_size: int = Field(
        10, ge=2, description="the first isometry_size probe images form the Gram (keep <= every layer width)"
    )

    @model_validator(mode="after")
    def _sizes(self) -> DiagnosticsConfig:
        if self.isometry_size > (probe := self.probe_size or PROBE_SIZE):
            raise ValueError(f"diagnostics.isometry_size = {self.isometry_size} must be <= probe_size ({probe})")
        return self


class RunConfig(_Strict):
    name: str = Field("run", description="the run's name, the start of its directory's name (not a path)")
    seed: int = Field(0, ge=0, lt=2**63, description="seeds the split, the initial model, sampling and batches")
    engine: Literal["local", "flower"] = "local"
    data: DataConfig
    partition: PluginBlock = Field(default_factory=lambda: PluginBlock(name="dirichlet"))
    model: ModelBlock = Field(default_factory=ModelBlock)
    strategy: PluginBlock = Field(default_factory=lambda: PluginBlock(name="fedavg"))
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    simulation: SimulationConfig = Field(default_factory=SimulationConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    deploy: DeployConfig = Field(default_factory=DeployConfig)

    @field_validator("name")
    @classmethod
    def _a_name_not_a_path(cls, name: str) -> str:
        if not is_name(name):
            raise ValueError(
                f"name = {brief(name)}: a run's name becomes a directory name under output.dir; give {NAME_RULE} "
                "(use output.dir or output.run_dir for paths)"
            )
        return name

    @model_validator(mode="after")
    def _checkpoints_happen(self) -> RunConfig:
        # checkpoints are written at multiples of checkpoint_every: beyond the last round, never, silently
        if (every := self.output.checkpoint_every) > (rounds := self.train.rounds):
            raise ValueError(
                f"output.checkpoint_every = {every} is more than train.rounds ({rounds}): no round would write a "
                f"checkpoint; give 0 (off) or 1..{rounds}"
            )
        return self

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return cls.model_validate_json(text)


def format_validation_error(err: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """Every problem of validating ``model`` on one line, each naming its field, what it got and what is allowed
    (for an unknown key, the valid keys of its section)."""
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {brief(value)})"
        msg = e["msg"]
        if e["type"] == "value_error":  # fedsim's own validators: the message names its fields
            lines.append(str(e["ctx"]["error"]))
            continue
        if e["type"] == "extra_forbidden":
            msg = f"unknown key{shown}; valid keys: {', '.join(section_keys(model, e['loc'][:-1]))}"
            shown = ""
        lines.append(f"{where or '<config>'}: {msg}{shown}{number_as_text(e)}")
    return one_line(lines)


def section_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys of the section at ``loc`` (a pydantic error's location: keys and list indices) in ``model``."""
    kinds: list[Any] = [model]
    for key in loc:
        if isinstance(key, str):  # a list index keeps the list's type: its models are found inside it below
            kinds = [m.model_fields[key].annotation for m in _models(kinds) if key in m.model_fields]
    return [name for m in _models(kinds) for name in m.model_fields]


def _models(kinds: list[Any]) -> list[type[BaseModel]]:
    """The pydantic models in type annotations ``kinds``, however nested (``X | None``, ``list[X]``)."""
    found = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
    inner = [arg for k in kinds for arg in get_args(k)]
    return found + (_models(inner) if inner else [])


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    if len(parents) >= MAX_DEPTH:  # as deep as a YAML value may nest (parse_yaml)
        raise ConfigError(f"--set {brief(dotted)}: more than {MAX_DEPTH} levels of keys; a config is a few deep")
    for key in parents:
        child = node.setdefault(key, {})
        if isinstance(child, str):  # a plugin given by its name alone is {name: <it>}: set one of its options
            child = node[key] = {"name": child}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {key!r} is not a section")
        node = child
    node[leaf] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides; values are parsed as YAML (``5``, ``ln``, ``[1,2]``)."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
            raise ConfigError(f"--set {brief(item)}: expected key.path=value, e.g. train.rounds=5")
        value = parse_yaml(text, f"--set {key.strip()}")
        _set_dotted(raw, key.strip(), value)
    return raw


def check_keys_once(overrides: list[str]) -> None:
    """Refuse a key given twice in one ``--set`` list (the last would win in silence, as a YAML key given twice
    would: refused too), naming it and both values."""
    seen: dict[str, str] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if sep and key.strip() in seen:
            raise ConfigError(
                f"--set {key.strip()} is given twice ({brief(seen[key.strip()])}, then {brief(text)}): give it once"
            )
        seen[key.strip()] = text


class _Refused(yaml.YAMLError):
    """Valid YAML that a config must not be (a key given twice, an alias bomb)."""


class _ConfigLoader(yaml.SafeLoader):
    """YAML as ``safe_load`` reads it, but a key given twice is an error (the second would silently replace
    the first, a whole section at the top level), and so are: aliases that expand to more than
    ``MAX_ALIAS_NODES`` nodes in all (a "billion laughs" document nests aliases to blow a few lines up
    into gigabytes; a sweep's anchors for repeated settings stay far below it), an alias inside the value
    it names (a value that contains itself), and nesting deeper than ``MAX_DEPTH`` (PyYAML's composer
    recurses: 800 bytes of brackets were a RecursionError)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.expanded = 0
        self.composing: list[yaml.Node | None] = []  # the parents of the node being composed, outermost first

    def compose_node(self, parent: Any, index: Any) -> Any:
        alias = self.check_event(yaml.AliasEvent)
        line = self.peek_event().start_mark.line + 1
        if len(self.composing) >= MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels at line {line}: a config is a few levels deep")
        self.composing.append(parent)
        try:
            node = super().compose_node(parent, index)
            if alias and any(node is outer for outer in self.composing):
                raise _Refused(f"the alias at line {line} is inside the value it names: a value cannot contain itself")
        finally:
            self.composing.pop()
        if alias:
            self.expanded += _size(node, {})
            if self.expanded > MAX_ALIAS_NODES:
                raise _Refused(
                    f"aliases (*name) expand to more than {MAX_ALIAS_NODES:,} values by line {line}: write the "
                    "values out"
                )
        return node


def _size(node: yaml.Node, seen: dict[int, int]) -> int:
    """How many nodes ``node`` stands for once every alias in it is expanded (shared subtrees counted once
    each, so a bomb is measured without being expanded)."""
    if id(node) not in seen:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        seen[id(node)] = 1 + sum(_size(child, seen) for child in children)
    return seen[id(node)]


def _mapping_without_duplicates(loader: _ConfigLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    _check_keys(loader, node)
    return loader.construct_mapping(node, deep)  # merge keys (``<<: *base``) merged: the mapping's own keys win


def _check_keys(loader: _ConfigLoader, node: yaml.MappingNode) -> None:
    """Refuse a key given twice in the mapping ``node`` or one that is not a name or a number; a merge key's
    mappings (``<<: *base``, ``<<: [*a, *b]``) may give keys the mapping gives again: that is what they are for."""
    seen: set[Any] = set()
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):  # `? [a, b]`: a key that is a list or a mapping
            raise _Refused(f"the key at line {key_node.start_mark.line + 1} is not a plain name or number")
        if key_node.tag == MERGE_TAG:
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for mapping in merged:  # its keys once each too (an anchored mapping was checked where it stands)
                if isinstance(mapping, yaml.MappingNode):
                    _check_keys(loader, mapping)
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise _Refused(f"key {brief(key)} is given twice (line {key_node.start_mark.line + 1}): give it once")
        seen.add(key)


_ConfigLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
# YAML 1.2's floats: PyYAML (YAML 1.1) reads 1e-3 and 1.0e6 (no dot, or no exponent sign) as text, which the
# strict number fields refuse; a researcher's ``lr: 1e-3`` is a number. Quoted '1e-3' stays text.
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)
MAX_ALIAS_NODES = 10_000
MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_DEPTH = 32


def parse_yaml(text: str, what: str) -> Any:
    """``text`` as YAML (duplicate keys, alias bombs, self-containing values, deep nesting and keys that
    are not names refused); errors name ``what`` it was."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except _Refused as err:
        raise ConfigError(f"{what}: {err}") from err
    except yaml.constructor.ConstructorError as err:  # YAML, but not plain values: a tag such as !!python/object
        where = f" at line {err.problem_mark.line + 1}" if err.problem_mark else ""
        raise ConfigError(
            f"{what}: {err.problem}{where}: a config holds plain YAML values (mappings, lists, text, numbers, "
            "true/false, null), anchors, aliases and << merges of mappings, no other tags"
        ) from err
    except yaml.YAMLError as err:
        problem = " ".join(str(err).split())
        raise ConfigError(f"{what}: not valid YAML ({problem[:300]}); quote a value that holds ': ' or braces") from err
    except ValueError as err:  # a scalar its tag cannot hold: `!!int 0x`, a 2001-13-45 date, 5,000 digits
        raise ConfigError(f"{what}: a value YAML cannot read ({str(err)[:200]}); quote it to give it as text") from err


def read_yaml(path: Path, what: str = "config file") -> Any:
    """A YAML file's content, read through :func:`fedsim.reading.read_text` (a regular UTF-8 file of at most
    ``CONFIG_BYTES``); anything else is an error naming it."""
    return parse_yaml(read_text(path, what, CONFIG_BYTES), str(path))


def _read_sections(path: Path, what: str, overrides: list[str] | None) -> dict[str, Any]:
    """The YAML file ``path`` (``what`` it is, for errors) as a mapping of sections, ``overrides`` applied."""
    raw = read_yaml(path, what) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return apply_overrides(raw, overrides or [])


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a config file, apply ``--set`` overrides and validate its sections; paths in it are made
    relative to the file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path}: a directory, not a YAML file")
    cfg = parse_config(_read_sections(path, "config file", overrides))
    for field, value in (("output.dir", cfg.output.dir), ("output.run_dir", cfg.output.run_dir)):
        if value and (error := unusable(Path(value), field)):
            raise error  # a file, a symlink loop: said before any work
    if cfg.data.root:
        cfg.data.root = resolve_path(cfg.data.root, path.parent)
        check_source(package_path(cfg.data.root), "data.root")  # a FIFO or a device would hang or never end
    if cfg.deploy.certificates is not None:
        certs = cfg.deploy.certificates
        certs.ca, certs.cert, certs.key = (resolve_path(p, path.parent) for p in (certs.ca, certs.cert, certs.key))
        for field, file in (("ca", certs.ca), ("cert", certs.cert), ("key", certs.key)):
            if not Path(file).is_file():
                raise ConfigError(f"deploy.certificates.{field}: no file at {file} (PEM; relative to the config file)")
    return cfg


def read_run_config(path: Path, overrides: list[str] | None = None, read_back: bool = False) -> RunConfig:
    """A run directory's ``config.yaml``, with ``overrides``: an error names the file, which its reader did not
    write (a run directory of another fedsim version's layout, or edited) and could not tell from the message.
    ``read_back``: read only, not to run here (:data:`READ_BACK`)."""
    raw = _read_sections(path, "the run's config.yaml", overrides)
    try:
        return parse_config(raw, read_back)
    except ConfigError as err:
        raise ConfigError(f"{path}{' with --set' if overrides else ''}: {err}") from err


def parse_config(raw: dict[str, Any], read_back: bool = False) -> RunConfig:
    """Validate a config mapping's sections (plugin options: :func:`fedsim.experiment.resolve`); ``read_back``:
    a run directory's, read only (:data:`READ_BACK`)."""
    try:
        return RunConfig.model_validate(raw, context={READ_BACK: read_back})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, RunConfig)) from err


# Config keys that do not change what a run learns: resume, checksums, reports and sweeps ignore them
NOT_LEARNING = ("name", "output.", "simulation.", "diagnostics.", "deploy.")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"model.norm": "ln", ...}`` (empty sections kept as leaves)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat
