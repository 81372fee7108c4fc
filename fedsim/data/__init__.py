"""Datasets as in-memory uint8 tensors, and the registry of loaders that produce them.

A loader is a :class:`DatasetLoader` subclass registered in :data:`DATASETS`, with its own options
in a nested ``Params`` (YAML ``data.dataset: {name: ..., <options>}``, usually just the name) and a
:meth:`~DatasetLoader.load` that reads a :class:`DataSource` (``data.root``, ``data.download``, the
cache directory); its docstring's first line is what ``fedsim list`` shows. Data is decoded once per
process and kept as uint8 NCHW tensors (batching slices them: no per-sample decoding in training).
"""

from __future__ import annotations

from fedsim.data import domains, imagefolder, npz, synthetic, tinyimagenet, torchvision_sets  # noqa: F401 (the built-ins register themselves on import)
from fedsim.data.base import (
    ASSETS_DIR,
    DATASETS,
    ArrayDataset,
    DatasetLoader,
    DataSource,
    data_source,
    default_cache_dir,
    labels_int64,
    load_dataset,
    nchw_uint8,
    read_dataset,
)

__all__ = [
    "ASSETS_DIR",
    "DATASETS",
    "ArrayDataset",
    "DatasetLoader",
    "DataSource",
    "data_source",
    "default_cache_dir",
    "labels_int64",
    "load_dataset",
    "nchw_uint8",
    "read_dataset",
]
