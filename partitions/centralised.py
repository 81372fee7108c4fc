"""The centralised baseline: one client holding the whole training and test set (LN-FL Figs. 4 and 6).

With ``train.num_clients: 1`` every round is K steps of SGD on batches drawn from all the data, scored
on the whole test set (client-mean accuracy = the single client's accuracy), so a sweep can put
centralised training beside federated runs of the same steps per round. LN-FL's Fig. 4 matches the
data seen per round with a batch N times larger (320 = 10 clients x 32).
"""

from __future__ import annotations

import numpy as np

from fedsim.errors import ConfigError
from fedsim.partitions.base import PARTITIONERS, Labels, Partition, Partitioner


@PARTITIONERS.register("centralised")
class CentralisedPartitioner(Partitioner):
    """Centralised training: one client holds every train and test sample (needs train.num_clients: 1)."""

    def check_clients(self, num_clients: int) -> None:
        if num_clients != 1:
            raise ConfigError(
                f"partition 'centralised' puts the whole training set on one client: train.num_clients must be 1, "
                f"got {num_clients}"
            )

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        return Partition(train=[np.arange(len(labels.train), dtype=np.int64)],
                         test=[np.arange(len(labels.test), dtype=np.int64)])  # fmt: skip
