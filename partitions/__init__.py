"""Partitioners: split a labelled dataset's train and test indices among clients.

A partitioner is a :class:`Partitioner` subclass registered in :data:`PARTITIONERS`, with its YAML
options in a nested ``Params`` (``partition: {name: dirichlet, beta: 0.5}``), built as
``Partitioner(params)``; it implements :meth:`Partitioner.assign`, and :meth:`Partitioner.split`
checks the inputs every partitioner shares before calling it. Each split's exact procedure:
docs/algorithms.md.
"""

from __future__ import annotations

from fedsim.partitions import centralised, dirichlet, domains, iid, n_class, natural  # noqa: F401 (the built-ins register themselves on import)
from fedsim.partitions.base import (
    PARTITIONERS,
    Labels,
    Partition,
    Partitioner,
    check_split_inputs,
    class_counts,
    sorted_int64,
)

__all__ = [
    "PARTITIONERS",
    "Labels",
    "Partition",
    "Partitioner",
    "check_split_inputs",
    "class_counts",
    "sorted_int64",
]
