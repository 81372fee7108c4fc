"""IID split: shuffle, cut into near-equal parts. The sanity check and the beta -> inf limit of Dir(beta)."""

from __future__ import annotations

import numpy as np

from fedsim.partitions import (
    PARTITIONERS,
    Partition,
    Partitioner,
    PartitionParams,
    check_split_inputs,
    sorted_int64,
)


@PARTITIONERS.register("iid")
class IIDPartitioner(Partitioner):
    """Uniformly random split; client sizes differ by at most one sample."""

    class Params(PartitionParams):
        pass

    def split(
        self,
        train_labels: np.ndarray,
        test_labels: np.ndarray,
        num_clients: int,
        num_classes: int,
        params: PartitionParams,
        rng: np.random.Generator,
    ) -> Partition:
        self.Params.model_validate(params.model_dump())  # rejects another partitioner's options
        check_split_inputs("iid", train_labels, test_labels, num_clients, num_classes)
        train = np.array_split(rng.permutation(len(train_labels)), num_clients)
        test = np.array_split(rng.permutation(len(test_labels)), num_clients)
        return Partition(train=sorted_int64(train), test=sorted_int64(test))
