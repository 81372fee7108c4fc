"""The schemas of the JSON files a run directory holds, as strictly as fedsim writes them: a line of
metrics.jsonl (:class:`RoundRecord`; a ``fedsim local`` continuation's, :class:`StepRecord`),
progress.json (:class:`Progress`), summary.json (:class:`Summary`) and a line of workers.jsonl
(:class:`WorkerRecord`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from fedsim.record.layout import MANIFEST, RECORD_VERSION


class Written(BaseModel):
    """Base of the schemas of the JSON files fedsim writes, as strictly as it writes them: a number is never
    text, and JSON has no NaN; fields a schema does not name are kept."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def _numeric(value: Any) -> bool:
    if isinstance(value, list):
        return all(_numeric(v) for v in value)
    if isinstance(value, dict):
        return all(_numeric(v) for v in value.values())
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _metric(value: Any) -> Any:
    if not _numeric(value):
        raise PydanticCustomError("metric", "a metric is a number or null, or a list or mapping of them")
    return value


# every metric fedsim writes (a loss, per-class accuracies, failed clients by round): numbers, null where
# nothing was measured, never text or a boolean, which a table or figure would show as if measured
Metric = Annotated[Any, AfterValidator(_metric)]


class MetricsRecord(Written):
    """A line of ``metrics.jsonl``: the fields that ``fedsim report`` and ``fedsim plot`` read, and any other
    metric, kept as written once it is numbers (:data:`Metric`)."""

    __pydantic_extra__: dict[str, Metric] = Field(init=False)

    client_mean_acc: float | None = Field(None, ge=0, le=1)
    global_acc: float | None = Field(None, ge=0, le=1)
    own_class_acc: float | None = Field(None, ge=0, le=1)
    other_class_acc: float | None = Field(None, ge=0, le=1)
    feature_erank: float | None = None
    feature_norm_mean: float | None = None
    feature_sv: list[float | None] | None = None
    time_s: float | None = Field(None, ge=0)  # time since the run started
    rss_mb: float | None = Field(None, ge=0)
    client_acc: list[Annotated[float, Field(ge=0, le=1)] | None] | None = None
    eval_clients: list[Annotated[int, Field(ge=0)]] | None = None  # eval.clients: the sample client_acc lists, in order
    personal_acc: float | None = Field(None, ge=0, le=1)  # eval.personal: the personalised models' client-mean
    client_personal_acc: list[Annotated[float, Field(ge=0, le=1)] | None] | None = None


def _within(index: str, value: int, info: ValidationInfo) -> int:
    """``value`` of the ``index`` field, once it is at most ``info.context["last"]`` (the run's rounds, a
    continuation's steps) and, where ``info.context["cadence"]`` is given, a round it evaluates: a line beyond
    the run, or at a round it did not evaluate (an edit, a line of another run), is one it could not have written."""
    context = info.context or {}
    last, cadence = context.get("last"), context.get("cadence")
    if last is not None and value > last:
        raise PydanticCustomError(
            "beyond_the_run", "{index} {value} is beyond the run's {last} {index}s",
            {"index": index, "value": value, "last": last},
        )  # fmt: skip
    if cadence is not None and not cadence.is_eval_round(value):
        raise PydanticCustomError(
            "not_evaluated", "round {value} is not one the run evaluated (eval.every: {every}, and its last, {last})",
            {"value": value, "every": cadence.every, "last": cadence.num_rounds},
        )  # fmt: skip
    return value


class RoundRecord(MetricsRecord):
    round: int = Field(ge=1)

    @field_validator("round")
    @classmethod
    def _within_rounds(cls, value: int, info: ValidationInfo) -> int:
        return _within("round", value, info)


class StepRecord(MetricsRecord):
    step: int = Field(ge=0)

    @field_validator("step")
    @classmethod
    def _within_steps(cls, value: int, info: ValidationInfo) -> int:
        return _within("step", value, info)


class Versioned(Written):
    """What a JSON file of the record says of its version: what an upgrade reads of an older one before it
    knows which fields it has (fedsim.record.upgrade)."""

    record_version: int | None = None


class FileEntry(BaseModel):
    """A file's entry in a manifest (:mod:`fedsim.record.manifest`): its size and the SHA-256 of its bytes."""

    model_config = ConfigDict(extra="forbid", strict=True)

    size: int = Field(ge=0)
    sha256: str = Field(pattern="^[0-9a-f]{64}$")


def _listed(files: dict[str, FileEntry] | None) -> dict[str, FileEntry] | None:
    """A manifest lists files of the layout's manifest only (:data:`fedsim.record.layout.MANIFEST`)."""
    if files is not None and (other := sorted(set(files) - set(MANIFEST))):
        raise PydanticCustomError(
            "not_listed", "{name} is not a file a manifest lists (those are {allowed})",
            {"name": other[0], "allowed": ", ".join(MANIFEST)},
        )  # fmt: skip
    return files


# progress.json's and summary.json's manifest
Manifest = Annotated[dict[str, FileEntry], AfterValidator(_listed)]


def _complete(record: Versioned, keys: tuple[str, ...]) -> Any:
    """``record`` once the checksums ``keys`` are all there, if it is of this record version (an older one is
    refused whole by its reader, naming the upgrade)."""
    if record.record_version == RECORD_VERSION and (missing := [k for k in keys if getattr(record, k) is None]):
        raise PydanticCustomError("missing", "{key}: Field required", {"key": missing[0]})
    return record


class Progress(Versioned):
    """``progress.json`` (:meth:`RunDir.write_progress`): the latest round, its training loss and client-mean
    accuracy (None: not evaluated that round)."""

    round: int = Field(ge=0)
    loss: float | None
    acc: float | None = Field(ge=0, le=1)
    # of this record version (fedsim.record.reader.check_version) the manifest is there (_complete)
    record_version: int | None = None
    files: Manifest | None = None  # fedsim.record.manifest

    @model_validator(mode="after")
    def _all_checksums(self) -> Progress:
        return _complete(self, ("files",))


class Summary(Versioned):
    """``summary.json``: the fields that ``fedsim report`` and ``fedsim plot`` read (others kept)."""

    rounds: int = Field(ge=1)
    final_client_mean_acc: float | None = Field(ge=0, le=1)
    best_client_mean_acc: float | None = Field(ge=0, le=1)
    final_global_acc: float | None = Field(ge=0, le=1)
    final_personal_acc: float | None = Field(None, ge=0, le=1)  # eval.personal on only
    best_personal_acc: float | None = Field(None, ge=0, le=1)
    # of this record version (fedsim.record.reader.check_version) both checksums are there (_complete)
    record_version: int | None = None
    files: Manifest | None = None  # fedsim.record.manifest
    summary_sha256: str | None = None  # fedsim.record.manifest.summary_checksum
    data_sha256: str | None = None  # fedsim.data.fingerprint (None: a summary written by hand, for a test)

    @model_validator(mode="after")
    def _all_checksums(self) -> Summary:
        return _complete(self, ("files", "summary_sha256"))


class WorkerRecord(Written):
    """A line of ``workers.jsonl`` (:mod:`fedsim.engines.ray_pool`): a worker of the Ray pool, the clients it
    serves, and where Ray placed it, as the worker itself saw it once started."""

    actor: int = Field(ge=0)  # the pool's index of the worker: partition p is served by actor p mod the pool's size
    clients: list[Annotated[int, Field(ge=0)]]  # the partitions it serves
    started: str  # when the pool started it (ISO 8601, this machine's local time)
    replaces: str | None  # how the worker it took over from was lost; None for one of the pool's first
    node_id: str  # Ray's id of the node it ran on (ray.get_runtime_context().get_node_id())
    node_ip: str
    pid: int
    gpu_ids: list[int | str]  # ray.get_gpu_ids(): the GPUs Ray assigned it
    cuda_visible_devices: str | None  # as Ray set it in the worker's environment (None: not set)
    device: str  # the torch device its clients compute on (simulation.device)
