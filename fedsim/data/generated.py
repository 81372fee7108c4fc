"""Datasets generated per client (:class:`GeneratedLoader`): federations of any size, never held whole.

A loaded dataset (:class:`~fedsim.data.base.ArrayDataset`) is split among clients by a partitioner; a
generated one *is* its federation: client ``k``'s train and test samples are drawn from the loader's
own seed and ``k`` alone, when a round first needs them, so a run of a million clients holds the
samples of the clients it trains, not the federation's. Its samples may be feature vectors (float32)
rather than uint8 images; a run on them takes no image augmentation or per-channel normalisation.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import torch

from fedsim.data.base import ArrayDataset, DatasetLoader, DataSource
from fedsim.errors import DataError


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no single truth value
class ClientArrays:
    """One client's samples: ``x_*`` float32 (n, *in_shape) or uint8 N x C x H x W, ``y_*`` int64 class indices."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


class GeneratedLoader(DatasetLoader):
    """Base of the datasets generated per client: :meth:`client` draws one client's samples.

    ``classes`` and ``in_shape`` describe every client's samples; :meth:`fingerprint` stands for the whole
    federation (a SHA-256 of the generator's definition and options), as a loaded dataset's fingerprint does."""

    images = False  # feature vectors: no crop / flip augmentation, no per-channel statistics

    @property
    @abstractmethod
    def classes(self) -> list[str]:
        """The class names; labels are indices into them."""

    @property
    @abstractmethod
    def in_shape(self) -> tuple[int, int, int]:
        """The shape of one sample, as models take it (a feature vector of d values: (1, 1, d))."""

    @abstractmethod
    def client(self, cid: int) -> ClientArrays:
        """Client ``cid``'s train and test samples: the same for the same options and ``cid``, in any process."""

    @abstractmethod
    def fingerprint(self) -> str:
        """SHA-256 (hex) of what determines every client's samples (the generator's version and options)."""

    def load(self, source: DataSource) -> ArrayDataset:
        raise DataError(f"{type(self).__name__} is generated per client (GeneratedLoader.client), never loaded whole")
