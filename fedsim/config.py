"""The run configuration's schema: one YAML file's sections, validated by pydantic before anything starts.

The sections are typed here; :mod:`fedsim.config_file` reads a file (YAML, ``--set`` overrides) into them and
words their errors. Plugins (the dataset, the partitioner, the model, its normaliser, the
strategy) are written one way, ``{name: ..., <options>}`` or just the name (:class:`PluginBlock`);
their options belong to the plugin and are validated against its own ``Params`` once, by
:func:`fedsim.experiment.resolve.resolve`, so this module imports no plugin.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import warnings
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, to_jsonable_python

from fedsim.errors import FedsimWarning, brief
from fedsim.names import NAME_RULE, is_name, printable
from fedsim.paths import home_expanded
from fedsim.registry import Float32Options, all_floats


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
            try:  # experiment/resolve.py passes them through JSON (an API caller's mapping may hold anything)
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
# the longest wait a config may ask for: longer is never meant, and Python's own waits overflow beyond
# threading.TIMEOUT_MAX (about 9.2e9 s)
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
    max_grad_norm: float | None = Field(
        None,
        gt=0,
        description="each local step's gradient, per client, clipped to this total norm before the SGD update "
        "(torch.nn.utils.clip_grad_norm_; a strategy's gradient corrections included, weight decay not), as "
        "FedDyn's authors' code does with 10; null: no clipping. Not eval.personal's fine-tuning",
    )
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


class PersonalEvalConfig(_Strict):
    """Personalised evaluation (docs/algorithms.md): each client's model after its method's personalisation
    (:meth:`fedsim.strategies.hooks.ClientHooks.personalize`; the generic one: ``steps`` SGD steps from the
    received global model), scored on the client's test split beside the global model."""

    steps: int | None = Field(
        None,
        ge=0,
        le=MAX_LOCAL_STEPS,
        description="fine-tuning SGD steps on the client's training batches before it is scored (personal_acc in "
        "metrics.jsonl); 0: the method's own personalisation without fine-tuning; null: off",
    )
    params: Literal["all", "classifier"] = Field(
        "all", description="what the fine-tuning changes: every parameter (all), or the classifier alone with the "
        "rest of the model as received, its norms' statistics included (classifier)",
    )
    lr: float | None = Field(None, gt=0, description="the fine-tuning's learning rate; null: train.lr")
    every: int | None = Field(
        None, ge=1, description="personalise at every k-th round (a multiple of eval.every) and after the last, the "
        "other evaluations scoring the global model alone; null: at every evaluation",
    )


class EvalConfig(_Strict):
    every: int = Field(10, ge=1, description="evaluate every k rounds (and after the last)")
    batch_size: int = Field(
        500, ge=1, description="images whose loss is summed at once (the forward pass runs in chunks of 50 inside it)"
    )
    global_test: bool = Field(True, description="also evaluate the global model on the whole test set")
    clients: int | None = Field(
        None, ge=1, le=10**6, description="score a sample of this many clients at each evaluation, drawn from the "
        "run's seed and the round (metrics.jsonl lists them as eval_clients); null: every client",
    )
    personal: PersonalEvalConfig = Field(default_factory=PersonalEvalConfig)

    @model_validator(mode="after")
    def _personal_on_evaluations(self) -> EvalConfig:
        # the fine-tuning's options mean nothing with it off: one given would be a measurement believed made
        defaults = PersonalEvalConfig()
        for key in ("every", "lr", "params"):
            if self.personal.steps is None and (value := getattr(self.personal, key)) != getattr(defaults, key):
                raise ValueError(
                    f"eval.personal.{key} = {value!r} is given but eval.personal.steps is null (personalised "
                    f"evaluation off): set eval.personal.steps (0 or more), or remove eval.personal.{key}"
                )
        # a personalised round that is not an evaluation round would never be scored
        if (personal := self.personal.every) is not None and personal % self.every:
            raise ValueError(
                f"eval.personal.every = {personal} must be a multiple of eval.every ({self.every}): personalised "
                "accuracy is scored at evaluations"
            )
        return self


class ClientResources(_Strict):
    num_cpus: float = Field(1.0, gt=0)
    num_gpus: float = Field(0.0, ge=0)


THREADS_PER_CPU = 4  # simulation.threads' bound, in CPUs of the machine
RAY_PROBE_TIMEOUT_S = 10.0  # the most simulation.ray_address's check waits for a Ray cluster to answer
# the most a run waits, once a worker is lost, for the head to answer again: well inside the 60 s after which
# Ray ends a driver whose GCS is gone (gcs_rpc_server_reconnect_timeout_s) in lines of its own
RAY_HEAD_WAIT_S = 20.0
# the most clients of a run on the Ray pool or Flower's runtime: they hold each client's node (a Context, the pool's
# assignment, a partition query before round 1); the inline engine holds only the nodes a round serves
POOLED_CLIENTS = 10_000
# validation context: a run directory's config read back (fedsim report, plot), not run on this machine
READ_BACK = "read_back"


class SimulationConfig(_Strict):
    backend: Literal["auto", "inline", "ray"] = Field(
        "auto",
        description="engine local: clients in this process (inline) or on a Ray actor pool; auto: the pool when "
        "this machine has 2+ cores and a round 2+ clients on the CPU (or ray_address is set), else inline "
        f"(fedsim.layout). The pool and engine flower serve at most {POOLED_CLIENTS:,} clients (train.num_clients): "
        "each holds every client's node; inline holds only the clients a round serves",
    )
    client_resources: ClientResources = Field(default_factory=ClientResources)
    ray_address: str | None = Field(
        None,
        pattern=r"^(auto|(ray://)?[^\s/]+:\d+)$",
        description="join an existing Ray cluster: auto, host:port (GCS) or ray://host:port (Ray Client); checked "
        f"before the run starts: a Ray of this Ray and Python version must answer there within {RAY_PROBE_TIMEOUT_S:g} "
        "s; unset: a Ray instance of this process alone, every server on 127.0.0.1. A head that goes away mid-run "
        f"(its GCS, asked throughout each round, not answering within {RAY_HEAD_WAIT_S:g} s) stops the run in one "
        "line, the last checkpoint kept; under engine: flower the driver is a child of the fedsim run process, "
        "which says how it ended if Ray ended it",
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
    """What ``fedsim.experiment.diagnostics`` measures on a fixed probe batch at each evaluation (all off: free)."""

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
        10, ge=2, description="the first isometry_size probe images form the Gram (at most every layer's width)"
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
    def _pooled_federation_fits(self) -> RunConfig:
        n, sim = self.train.num_clients, self.simulation
        if n <= POOLED_CLIENTS:
            return self
        for given, field in (
            (self.engine == "flower", "engine: flower"),
            (sim.backend == "ray", "simulation.backend: ray"),
            (sim.ray_address is not None, "simulation.ray_address"),
        ):
            if given:
                raise ValueError(
                    f"{field} serves at most {POOLED_CLIENTS:,} clients (each client's node held from the start), "
                    f"train.num_clients is {n:,}: run larger federations on engine: local, simulation.backend: inline "
                    "(auto picks it), which holds only the clients a round serves"
                )
        return self

    @model_validator(mode="after")
    def _evaluated_clients_exist(self) -> RunConfig:
        if (clients := self.eval.clients) is not None and clients > (n := self.train.num_clients):
            raise ValueError(
                f"eval.clients = {clients} must be in 1..train.num_clients ({n}), or null for every client"
            )
        return self

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
