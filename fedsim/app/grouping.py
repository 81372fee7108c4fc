"""Runs pooled over seeds: the rows of ``fedsim report`` and the bands of ``fedsim plot --mean-over-seeds``
(:func:`seed_groups`), labelled by the config values they differ in (:func:`varying_keys`, :func:`short_keys`),
their spread over the seeds measured one way (:func:`measure_spread`)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from fedsim.config import NOT_LEARNING
from fedsim.errors import DataError, FedsimError
from fedsim.record.manifest import DATA_FINGERPRINT

_IGNORED = ("seed", *NOT_LEARNING)  # reports also average over seeds
_NOT_LEARNING_NAMES = [key.rstrip(".") for key in NOT_LEARNING]


def varying_keys(runs: list[dict[str, Any]]) -> list[str]:
    """Flattened config keys whose value differs between runs.

    Not ``name``, ``seed``, nor the ``output``, ``simulation`` and ``diagnostics`` sections: they
    do not change what a run learns (seeds are what ``fedsim report`` averages over).
    """
    keys = sorted({k for r in runs for k in r["config"]})
    return [k for k in keys if not k.startswith(_IGNORED) and len({json.dumps(r["config"].get(k)) for r in runs}) > 1]


def short_keys(keys: list[str], taken: tuple[str, ...] = ()) -> list[str]:
    """Labels for config ``keys``: a key's last part, or its plugin's for a name (``model.norm.name`` -> norm),
    with as many parts before it as tell it apart from the other keys' labels and from ``taken`` (the other
    columns of a table): ``train.rounds`` beside a ``rounds`` column, ``model.norm.eps`` beside ``strategy.eps``."""
    parts = [key.split(".") for key in keys]
    parts = [p[:-1] if p[-1] == "name" and len(p) > 1 else p for p in parts]  # strategy.name -> strategy
    used = [1] * len(parts)
    while True:
        labels = [".".join(p[-n:]) for p, n in zip(parts, used, strict=True)]
        counts = Counter([*labels, *taken])
        clashing = [i for i, label in enumerate(labels) if counts[label] > 1 and used[i] < len(parts[i])]
        if not clashing:
            return labels
        for i in clashing:
            used[i] += 1


def seed_groups(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs grouped by the config values they differ in (:func:`varying_keys`), seeds pooled: the rows of
    ``fedsim report`` and the bands of ``fedsim plot --mean-over-seeds``. Keyed by a label naming those
    values (``strategy=fedavg, norm=ln``; a key a run does not set is left out), in the runs' order.

    A group's runs have distinct seeds: two runs of one config and seed (a copied run directory, a run made
    twice) are one sample, and counted as two they would make the seed count and the std a lie, so they are
    an error naming both directories. They trained on one dataset: finished runs whose summaries record other
    data fingerprints (``data_sha256``; the file at ``data.root`` replaced between seeds) are an error naming
    two of them, since their mean would be over two datasets under one label; a summary without one (a fedsim
    before data fingerprints) is not compared."""
    keys = varying_keys(runs)
    groups: dict[str, list[dict[str, Any]]] = {}
    seeds: dict[tuple[str, str], dict[str, Any]] = {}
    data: dict[str, dict[str, Any]] = {}  # a group's first run that records its data's fingerprint
    for run in runs:
        values = [(label, run["config"].get(k)) for label, k in zip(short_keys(keys), keys, strict=True)]
        label = ", ".join(f"{k}={v}" for k, v in values if v is not None) or "runs"
        seed = run["config"].get("seed")
        first = seeds.setdefault((label, json.dumps(seed)), run)
        if first is not run:
            raise FedsimError(
                f"{first['dir']} and {run['dir']} are both seed {seed} of one config ({', '.join(_NOT_LEARNING_NAMES)} "
                "aside): runs are averaged over distinct seeds; move one of them out of the directories given"
            )
        if (fingerprint := (run["summary"] or {}).get(DATA_FINGERPRINT)) is not None:
            other = data.setdefault(label, run)["summary"][DATA_FINGERPRINT]
            if other != fingerprint:
                raise DataError(
                    f"{data[label]['dir']} and {run['dir']} are seeds of one config trained on other data "
                    f"({DATA_FINGERPRINT} {other[:16]}... and {fingerprint[:16]}... in their summary.json: "
                    "data.root held other data): runs are averaged over one dataset; move the runs of the other data "
                    "out of the directories given"
                )
        groups.setdefault(label, []).append(run)
    return groups


def measure_spread(values: ArrayLike) -> np.ndarray:
    """The spread of a setting's seeds (along axis 0): their sample standard deviation, n - 1 in the denominator
    (numpy's ``ddof=1``); 0 for one seed. Every ± of ``fedsim report`` and every band and error bar of
    ``fedsim plot`` is this, and so is every ± of docs/results.md."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return np.zeros(values.shape[1:])
    return values.std(axis=0, ddof=1)
