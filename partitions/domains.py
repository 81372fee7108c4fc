"""Domain-wise clients: every client holds data of one domain only (LN-FL Table 5, PACS).

The dataset must record each image's domain (``data.dataset: pacs`` or ``domains``: a
``<domain>/<class>/<image>`` tree). Clients are numbered domain by domain, domains in sorted order:
clients d*k ... d*k + k - 1 hold domain d, k = ``clients_per_domain``, so ``train.num_clients`` must
be (number of domains) x k. Within a domain, its train and test samples are split among its k
clients by ``within``:

- ``iid``: the ``iid`` partitioner on the domain (k = 1: each client holds one whole domain);
- ``classes``: disjoint sets of classes, the domain's classes in a seeded order cut into k groups
  whose sizes differ by at most one, each client holding all of its classes' samples (PACS's 7
  classes, k = 3: LN-FL's "2-2-3 classes");
- ``dirichlet``: the ``dirichlet`` partitioner (Dir(``beta``) per class) on the domain (LN-FL's
  Dir(0.5), Dir(1.0) columns).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from fedsim.errors import DataError
from fedsim.partitions.base import PARTITIONERS, Labels, Partition, Partitioner, sorted_int64
from fedsim.partitions.dirichlet import DirichletPartitioner
from fedsim.partitions.iid import IIDPartitioner


@PARTITIONERS.register("domains")
class DomainPartitioner(Partitioner):
    """Each domain of a <domain>/<class>/ dataset (PACS) to its own clients: whole, disjoint classes or Dir(beta)."""

    class Params(Partitioner.Params):
        clients_per_domain: int = Field(1, ge=1, description="k: clients holding each domain")
        within: Literal["iid", "classes", "dirichlet"] = Field(
            "iid", description="how a domain is split among its k clients"
        )
        beta: float = Field(0.5, gt=0, description="within: dirichlet: the concentration")

    params: Params

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        if labels.train_domain is None or labels.test_domain is None:
            raise DataError(
                "partition 'domains' needs a dataset that records each image's domain: data.dataset: pacs or "
                "domains (a <domain>/<class>/<image> tree)"
            )
        k, num_domains = self.params.clients_per_domain, len(labels.domains)
        if num_clients != num_domains * k:
            raise DataError(
                f"partition 'domains': {num_domains} domains ({', '.join(labels.domains)}) x clients_per_domain {k}"
                f" = {num_domains * k} clients, but train.num_clients is {num_clients}"
            )
        train: list[np.ndarray] = []
        test: list[np.ndarray] = []
        for d in range(num_domains):
            tr, te = np.flatnonzero(labels.train_domain == d), np.flatnonzero(labels.test_domain == d)
            part = self._within(Labels(labels.train[tr], labels.test[te], labels.num_classes), k, rng)
            train += [tr[p] for p in part.train]
            test += [te[p] for p in part.test]
        return Partition(train=sorted_int64(train), test=sorted_int64(test))

    def _within(self, domain: Labels, k: int, rng: np.random.Generator) -> Partition:
        """One domain's samples (indices into the domain) split among its k clients."""
        if self.params.within == "classes":
            return disjoint_classes(domain, k, rng)
        if self.params.within == "dirichlet":
            return DirichletPartitioner(DirichletPartitioner.Params(beta=self.params.beta)).split(domain, k, rng)
        return IIDPartitioner(IIDPartitioner.Params()).split(domain, k, rng)


def disjoint_classes(labels: Labels, k: int, rng: np.random.Generator) -> Partition:
    """The classes present, in a seeded order, cut into k groups (sizes within one); a group's samples to a client."""
    present = np.unique(np.concatenate([labels.train, labels.test]))
    if len(present) < k:
        raise DataError(
            f"partition 'domains': a domain holds {len(present)} classes, fewer than clients_per_domain={k} "
            f"(within: classes gives each client its own classes)"
        )
    groups = np.array_split(rng.permutation(present), k)
    return Partition(
        train=[np.flatnonzero(np.isin(labels.train, g)) for g in groups],
        test=[np.flatnonzero(np.isin(labels.test, g)) for g in groups],
    )
