"""The natural partition of a dataset generated per client: client k holds the dataset's own client k."""

from __future__ import annotations

import numpy as np

from fedsim.errors import DataError
from fedsim.partitions.base import PARTITIONERS, Labels, Partition, Partitioner


@PARTITIONERS.register("natural")
class NaturalPartitioner(Partitioner):
    """Each client's own samples, for datasets generated per client (synthetic); splits no loaded dataset."""

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        raise DataError(
            "partition 'natural' takes each client's own samples from a dataset generated per client (synthetic); "
            "a loaded dataset is split by a partitioner: dirichlet, n_class, iid, ... (fedsim list partitions)"
        )
