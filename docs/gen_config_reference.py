"""The configuration reference, generated from the pydantic models in ``fedsim/config.py``.

``python docs/gen_config_reference.py`` prints it; the site's build (``docs/hooks.py``) puts it into
``docs/configuration.md`` in place of the marker below, so the reference cannot drift from the code. Each
row is a field of :class:`fedsim.config.RunConfig` or of one of its sections: key, type, default,
constraints (pydantic's ``ge`` / ``gt`` / ``le`` / ``lt`` / ``pattern`` and the choices of a ``Literal``)
and the field's ``description``, followed by the notes below where a key needs more than one line.
``tests/test_docs.py`` checks that every field has a description or a note and that every note names a field.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fedsim.config import PluginBlock, RunConfig

MARKER = "<!-- generated: configuration reference -->"
PLUGINS_MARKER = "<!-- generated: built-in plugins -->"

PLUGIN = "plugin: a name, `package.module:Name`, or `{name: ..., <options>}`"

# What a field's one-line description cannot hold (or the description of a field that has none).
NOTES: dict[str, str] = {
    "name": "the run directory is `<output.dir>/<name>-<YYYYmmdd-HHMMSS>` (`-2`, `-3`, ... when two start in "
    "the same second)",
    "engine": "`local` (fedsim's own Flower Grid: inline or a Ray actor pool) or `flower` (Flower's simulation "
    "runtime on Ray); the same config and seed give the same metrics on both",
    "data.dataset": "`mnist`, `fashion_mnist`, `cifar10`, `cifar100` (torchvision), `npz`, `imagefolder`, "
    "`tinyimagenet`, `domains` / `pacs` (a `<domain>/<class>/<image>` tree such as PACS, each image's domain "
    "recorded; options `test_fraction` 0.2, `size`), or your own (a name, or `{name: ..., <options>}`)",
    "data.root": "`fedsim:<path>` names a file shipped inside the installed package",
    "data.augment": "LN-FL App. C.3",
    "data.cache_dir": "unset: `$FEDSIM_CACHE`, else `~/.cache/fedsim`",
    "partition": "`dirichlet` (`beta` 0.5, `min_size` 0, `balance` false, `max_tries` 1000), `n_class` "
    "(`classes_per_client` 2, `assign` `random`: LN-FL's draw / `cyclic`: a round-robin deal, `max_draws` 100), "
    "`iid`, `centralised` (one client holding all the data, with `train.num_clients: 1`: the centralised "
    "baseline), `domains` (each client holds one domain of a `domains` / `pacs` dataset: `clients_per_domain` 1, "
    "`within` `iid` / `classes` (disjoint class sets) / `dirichlet` with `beta` 0.5); see [Partitions](partitions.md)",
    "model.name": "`cnn` (`hidden` [384, 192]: the paper's code; [384] is its Table 7), `resnet18` (`norm_sites`: "
    "`all`, or `inner`: the normaliser only at the inner site of each block, inside the residual branch, the "
    "stem's and post-addition sites `none`, LN-FL Table 13), `mlp` (`hidden` [200, 200]); the model's options "
    "sit beside `name`: all models take `bias` (false), `activation` (relu / tanh / gelu), `norm_position` "
    "(after / before). `model.args` and `model.norm_args` are deprecated (read, with a warning naming the new "
    "form, until the next release): write the options beside `name`",
    "model.norm": "the normaliser, e.g. `{name: gn, groups: 2}`, `{name: ln, affine: false}` (LN-FL's static "
    "LN), `{name: fn, inside: ln}` (FN on the feature plus LN at the conv / linear sites; with `resnet18`'s "
    '`norm_sites: inner`, LN-FL Table 13\'s "FedFN − n_MV inside"); see [Normalisers](normalizers.md)',
    "strategy": "a strategy name, `package.module:Spec` or a Flower strategy class; its options sit beside "
    "`name` (FedBN's `evaluate`: `local` scores each client's personalised model, `shared` the shared global "
    "model, as LN-FL reports FedBN); see [Strategies](strategies.md)",
    "train.rounds": "communication rounds",
    "train.num_clients": "clients (= partitions)",
    "train.clients_per_round": "never Flower's node ids",
    "train.local_steps": "give `local_steps` or `local_epochs`, not both",
    "train.batch_size": "`drop_last`; a client with fewer samples wraps around",
    "train.lr": "client SGD learning rate",
    "train.momentum": "client SGD momentum",
    "train.weight_decay": "client SGD weight decay",
    "train.on_client_failure": "applies to every engine; see [Failures](checkpoints.md#failures)",
    "eval.batch_size": "the chunks are faster and give the same logits",
    "eval.global_test": "global and per-class accuracy",
    "simulation.backend": "the run's `config.yaml` records the choice; see [Speed](speed.md)",
    "simulation.client_resources.num_cpus": "CPUs per client worker (Ray pool actors / Flower's actors)",
    "simulation.client_resources.num_gpus": "GPUs per client worker; fractional GPUs allowed "
    "(see [Ray clusters](ray-clusters.md))",
    "simulation.device": "the torch device clients train on: `cpu`, or `cuda` for a GPU (an error before the "
    "first round where torch sees none)",
    "simulation.ray_address": "see [Ray clusters](ray-clusters.md)",
    "simulation.threads": "so the pool computes what `backend: inline, threads: 1` does, bit for bit; a sweep "
    "running N cells at once gives each cell inline `cores / N` threads (`cpus_per_run` on Ray)",
    "simulation.state_memory_mb": "memory is bounded by this and a round's clients, not by the federation "
    "(see [Speed](speed.md#10-100-and-1000-clients))",
    "simulation.vmap_clients": "needs `train.local_steps` and a model without running statistics or noise (not "
    "`bn`, `ln_goldschmidt`, `ln_randomized`); for GPUs: on CPU it is slower (see [Speed](speed.md))",
    "output.run_dir": "refused if it holds a finished or resumable run",
    "output.save_model": "save the final global model as `model.pt`",
    "output.progress": "partition table, progress bar, summary table (stderr)",
    "deploy.address": "one port for the Fleet, Control and Runtime APIs; see [Deployment](deployment.md)",
    "deploy.port": "`fedsim compose`: 9093",
    "deploy.tls": "fedsim makes a local CA and a certificate for the address",
    "deploy.certificates": "paths relative to the config",
    "deploy.certificates.ca": "the CA that signed the SuperLink's certificate (PEM)",
    "deploy.certificates.cert": "the SuperLink's certificate (PEM)",
    "deploy.certificates.key": "its private key (PEM)",
    "deploy.supernode_auth": "fedsim makes a P-384 key pair per node and registers the public keys "
    "(`flwr supernode register`) before the nodes start; needs `deploy.tls` (a config error otherwise)",
    "deploy.private_network": "the launcher, the SuperLink and the SuperNodes; `false` to `flwr ls` it from outside",
    "diagnostics.features": "see [Diagnostics](diagnostics.md)",
}


def _type(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " / ".join(f"`{a}`" for a in typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "`null`"
    if isinstance(annotation, type) and issubclass(annotation, PluginBlock):
        return PLUGIN
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "`{" + ", ".join(annotation.model_fields) + "}`"
    return f"`{getattr(annotation, '__name__', annotation)}`"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return f"`{value.name}`" if isinstance(value, PluginBlock) else ""
    if field.default is PydanticUndefined:
        return "required"
    return f"`{json.dumps(field.default) if field.default in (None, True, False, '') else field.default}`"


_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _constraints(field: FieldInfo) -> str:
    found = []
    for meta in field.metadata:
        for attr, symbol in _BOUNDS.items():
            if isinstance(meta, annotated_types.BaseMetadata) and (bound := getattr(meta, attr, None)) is not None:
                found.append(f"{symbol} 2^63" if bound == 2**63 else f"{symbol} {bound:,}".replace(",", " "))
        if pattern := getattr(meta, "pattern", None):
            found.append(f"matches `{pattern}`")
    return ", ".join(found)


def fields(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """Every documented key, dotted, in the models' order: sections and nested models are opened, plugin
    blocks are one row each (their options belong to the plugin: ``fedsim list``)."""
    out: list[tuple[str, FieldInfo]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation)) if isinstance(a, type)]
        section = next((a for a in inner if issubclass(a, BaseModel) and a is not PluginBlock), None)
        if section is not None and not issubclass(section, PluginBlock):
            if section is not field.annotation:  # an optional sub-model (deploy.certificates) is a key itself
                out.append((key, field))
            out.extend(fields(section, f"{key}."))
        elif section is not None:  # the model block: name, norm, and the model's options beside them
            out.extend(fields(section, f"{key}."))
        else:
            out.append((key, field))
    return out


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    """The reference as Markdown: one table per section of :class:`RunConfig`."""
    lines: list[str] = []
    section = None
    for key, field in fields():
        plugin = isinstance(field.annotation, type) and issubclass(field.annotation, PluginBlock)
        head = f"`{key.split('.')[0]}`" if "." in key or plugin else "Top level"
        if head != section:
            section = head
            lines += ["", f"### {head}", ""]
            lines += ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
        text = "; ".join(t for t in (field.description, NOTES.get(key)) if t)
        row = [f"`{key}`", _type(field.annotation), _default(field), _constraints(field), text]
        lines.append("| " + " | ".join(_escape(c) for c in row) + " |")
    return "\n".join(lines).lstrip("\n") + "\n"


def _option(name: str, field: FieldInfo) -> str:
    default = "required" if field.is_required() else json.dumps(field.get_default(call_default_factory=True))
    extra = "; ".join(t for t in (_constraints(field), field.description) if t)
    return f"`{name}` = `{default}`" + (f" ({extra})" if extra else "")


def plugin_reference() -> str:
    """Every built-in plugin, by kind, as ``fedsim list`` shows it: name, summary, options with their defaults,
    ranges and descriptions (each plugin's ``Params``)."""
    from fedsim.app.plugins import ALL_REGISTRIES  # imports torch and Flower: only when the plugins are asked for

    lines: list[str] = []
    for kind, registry in ALL_REGISTRIES.items():
        lines += ["", f"### {kind}", "", "| name | what it is | options |", "|---|---|---|"]
        for entry in registry:
            params = getattr(entry.obj, "Params", None)
            options = params.model_fields.items() if isinstance(params, type) and issubclass(params, BaseModel) else []
            row = [f"`{entry.name}`", entry.summary, "<br>".join(_option(n, f) for n, f in options)]
            lines.append("| " + " | ".join(_escape(c) for c in row) + " |")
    return "\n".join(lines).lstrip("\n") + "\n"


if __name__ == "__main__":
    print(config_reference(), end="")
    print("\n## Built-in plugins\n")
    print(plugin_reference(), end="")
