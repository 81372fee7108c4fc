"""FedProx's synthetic federated benchmark, Synthetic(α, β) (Li et al., MLSys 2020, Sec. 5.1), generated per client.

Client k's data, as the authors' generator draws it (``data/synthetic_*/generate_synthetic.py`` of
litian96/FedProx), each client from its own stream ``SeedSequence([seed, k])`` in this order:

1. ``n_k = int(LogNormal(4, 2)) + 50`` samples (median 104, mean e^6 + 50 ≈ 453, a heavy tail: of a million
   clients at seed 0, 85 hold more than 100,000 and the largest 791,480; ``max_samples`` cuts it);
2. ``u_k ~ N(0, α)`` and ``B_k ~ N(0, β)``, α and β the standard deviations (numpy's ``scale``, as the code
   draws them; the paper writes them as variances, the same at α = β = 1 and 0). u_k, the mean of every entry
   of W_k and b_k, adds u_k (Σ_j x_j + 1) to each class's logit of a sample alike, so α changes no label: the
   same seed draws the same samples for every α (so does the authors' definition, in distribution);
3. ``v_k ~ N(B_k, 1)`` per coordinate (``iid``: ``v_k = B_k`` in every coordinate);
4. ``W_k ~ N(u_k, 1)`` (d x C) and ``b_k ~ N(u_k, 1)`` (C) (``iid``: one ``W``, ``b`` ~ N(0, 1) for every
   client, from the stream ``SeedSequence([seed, 2**32])``, W then b; the client's own stream skips them);
5. ``x ~ N(v_k, Σ)``, Σ diagonal with ``Σ_jj = j^-1.2`` (j = 1..d): ``v_k + j^-0.6 z``, z an n x d block of
   standard normals;
6. ``y = argmax(x W_k + b_k)`` (the argmax of the softmax), in float64;

the first ``int(0.9 n_k)`` samples train, the rest test (the code's split, which it takes after a shuffle
that i.i.d. samples make moot). ``x`` is then float32. FedProx's Synthetic-IID (``generate_iid.py``: v_k = 0)
is ``iid: true, alpha: 0, beta: 0``.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from fedsim.data.base import DATASETS
from fedsim.data.generated import ClientArrays, GeneratedLoader
from fedsim.digest import digest
from fedsim.registry import PluginParams

VERSION = "synthetic-1"  # the draws above: a change to them is another dataset, another fingerprint
SHARED_STREAM = 2**32  # the IID variant's W and b: a key no client id (< 2**32) takes


@DATASETS.register("synthetic")
class Synthetic(GeneratedLoader):
    """FedProx's Synthetic(alpha, beta): 60 features, 10 classes, each client generated from its id (any number)."""

    class Params(PluginParams):
        alpha: float = Field(
            1.0, ge=0, le=1e3, description="std of u_k, the mean of W_k's and b_k's entries (it changes no label)"
        )
        beta: float = Field(1.0, ge=0, le=1e3, description="how much the clients' inputs differ (std of B_k)")
        iid: bool = Field(False, description="one W, b for every client, v_k = B_k (Synthetic-IID: with beta 0)")
        dim: int = Field(60, ge=1, le=10_000, description="features per sample")
        num_classes: int = Field(10, ge=2, le=1_000, description="classes")
        max_samples: int | None = Field(
            None, ge=2, description="cut each client's n_k to at most this (null: the published power law uncut)"
        )
        seed: int = Field(0, ge=0, lt=2**63, description="the dataset's own seed (not the run's)")

    params: Params

    @property
    def classes(self) -> list[str]:
        return [str(c) for c in range(self.params.num_classes)]

    @property
    def in_shape(self) -> tuple[int, int, int]:
        return 1, 1, self.params.dim

    def fingerprint(self) -> str:
        return digest({"generator": VERSION, **self.params.model_dump(mode="json")})

    def client(self, cid: int) -> ClientArrays:
        p = self.params
        d, c = p.dim, p.num_classes
        rng = np.random.default_rng(np.random.SeedSequence([p.seed, cid]))
        n = int(rng.lognormal(4, 2)) + 50
        if p.max_samples is not None:
            n = min(n, p.max_samples)
        u, b_mean = rng.normal(0, p.alpha), rng.normal(0, p.beta)
        v = np.full(d, b_mean) if p.iid else rng.normal(b_mean, 1, d)
        if p.iid:
            shared = np.random.default_rng(np.random.SeedSequence([p.seed, SHARED_STREAM]))
            w, b = shared.normal(0, 1, (d, c)), shared.normal(0, 1, c)
        else:
            w, b = rng.normal(u, 1, (d, c)), rng.normal(u, 1, c)
        # x = v + sqrt(Σ_jj) z, in place (the same float64 values as the expression; a tail client of ~800,000
        # samples peaks at one n x d float64 array rather than three)
        x = rng.standard_normal((n, d))
        x *= np.arange(1, d + 1, dtype=np.float64) ** -0.6  # sqrt(j^-1.2)
        x += v
        y = torch.from_numpy(np.argmax(x @ w + b, axis=1).astype(np.int64))
        x32 = torch.from_numpy(x.astype(np.float32)).view(n, 1, 1, d)
        cut = int(0.9 * n)
        return ClientArrays(x32[:cut].contiguous(), y[:cut].contiguous(), x32[cut:].contiguous(), y[cut:].contiguous())
