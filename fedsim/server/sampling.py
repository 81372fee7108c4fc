"""Who trains in a round: fedsim's decision, not the strategy's (when it evaluates: :mod:`fedsim.cadence`).

Flower samples node ids with ``random.sample``; node ids are random per run, so results would
depend on the runtime. fedsim samples *partition ids* from its own stream, seeded by the run's seed
and the round, so a round trains the same clients under every engine, and after a resume.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClientSampler:
    """``clients_per_round`` of the partitions, drawn without replacement from a per-round stream."""

    partitions: tuple[int, ...]
    clients_per_round: int
    seed: int

    def sample(self, server_round: int) -> list[int]:
        """Partition ids training in ``server_round`` (all, or a seeded sample), sorted."""
        pids = sorted(self.partitions)
        if self.clients_per_round >= len(pids):
            return pids
        rng = np.random.default_rng([self.seed, server_round, 0x5A3])
        return sorted(rng.choice(pids, size=self.clients_per_round, replace=False).tolist())
