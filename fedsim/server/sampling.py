"""Who trains in a round, and who is scored: fedsim's decision, not the strategy's (when it evaluates:
:mod:`fedsim.cadence`).

Flower samples node ids with ``random.sample``; node ids are random per run, so results would
depend on the runtime. fedsim samples *partition ids* from its own stream, seeded by the run's seed
and the round, so a round trains the same clients under every engine, and after a resume. A draw
costs what it samples, not the federation's size (numpy's ``choice`` without replacement draws a
small sample of a large range by Floyd's method): a million-client round samples as a thousand-client one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TRAIN_STREAM, EVAL_STREAM = 0x5A3, 0xE7A1


@dataclass(frozen=True)
class ClientSampler:
    """``per_round`` of partitions ``0 .. num_clients - 1``, drawn without replacement from a per-round stream."""

    num_clients: int
    per_round: int
    seed: int
    stream: int = TRAIN_STREAM

    def sample(self, server_round: int) -> list[int]:
        """Partition ids of ``server_round`` (all, or a seeded sample), sorted."""
        if self.per_round >= self.num_clients:
            return list(range(self.num_clients))
        rng = np.random.default_rng([self.seed, server_round, self.stream])
        return sorted(rng.choice(self.num_clients, size=self.per_round, replace=False).tolist())
