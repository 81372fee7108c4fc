"""The training loop's batch path: index slicing and vectorised augmentation of uint8 tensors.

No PIL and no DataLoader: at paper scale (K=10 steps of batch 32 per client per round) worker
processes and per-sample transforms cost more than the SGD steps themselves.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F

Normalize = tuple[Sequence[float] | torch.Tensor, Sequence[float] | torch.Tensor]


def to_float(x_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float32 in [0, 1] (``x / 255``, as torchvision's ``ToTensor``); float32 features (a dataset
    generated per client, fedsim.data.generated) as they are."""
    if x_uint8.dtype == torch.float32:
        return x_uint8
    return x_uint8.to(torch.float32).div_(255)


def draw_crop_flip(n: int, padding: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample crop offsets ``(n, 2)`` (row, col) in ``[0, 2 * padding]`` and flip flags ``(n,)``.

    Drawn on the generator's device, offsets first, then flips: the only randomness of
    :func:`augment_batch`, so a seeded generator reproduces it.
    """
    device = generator.device
    offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=generator, device=device)
    flip = torch.randint(0, 2, (n,), generator=generator, device=device).bool()
    return offsets, flip


@lru_cache(maxsize=32)
def _pixel_grids(h: int, w: int, wp: int, device: torch.device) -> torch.Tensor:
    """Flat indices of an h x w window at (0, 0) of a row-stride-``wp`` image: [plain, mirrored]."""
    rows = torch.arange(h, device=device).view(h, 1) * wp
    cols = torch.arange(w, device=device)
    return torch.stack([rows + cols, rows + cols.flip(0)]).view(2, h * w)


def crop_flip(x_uint8: torch.Tensor, offsets: torch.Tensor, flip: torch.Tensor, padding: int) -> torch.Tensor:
    """Zero-pad by ``padding``, crop back to H x W at ``offsets``, mirror where ``flip``; uint8 in and out.

    One ``gather`` over the flattened padded images with per-sample flat indices (crop and flip
    folded into the index): measured faster here than torch.where over flipped copies, 4-tensor
    advanced indexing or a loop over samples.
    """
    n, c, h, w = x_uint8.shape
    hp, wp = h + 2 * padding, w + 2 * padding
    padded = F.pad(x_uint8, (padding, padding, padding, padding))
    offsets, flip = offsets.to(x_uint8.device), flip.to(x_uint8.device)
    start = offsets[:, 0] * wp + offsets[:, 1]  # flat index of each crop's top-left pixel
    index = _pixel_grids(h, w, wp, x_uint8.device).index_select(0, flip.long()) + start.view(n, 1)
    out = torch.gather(padded.view(n, c, hp * wp), 2, index.view(n, 1, h * w).expand(n, c, h * w))
    return out.view(n, c, h, w)


def augment_batch(x_uint8: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Random crop (zero padding ``padding``, back to the image's own size) + random horizontal flip.

    Per sample, vectorised over the batch, using only ``generator``; returns float32 in [0, 1].
    The paper's CIFAR recipe: ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip()``.
    """
    offsets, flip = draw_crop_flip(len(x_uint8), padding, generator)
    return to_float(crop_flip(x_uint8, offsets, flip, padding))


class BatchStream:
    """Mini-batches of one client's data, each of exactly ``batch_size`` samples.

    Samples are drawn by walking consecutive random permutations of the client's indices, a fresh
    permutation whenever the current one is exhausted. A permutation's remainder too small for a
    full batch is skipped (``drop_last``), except when the client holds fewer than ``batch_size``
    samples: then batches wrap across permutations, so even such a client yields full batches
    (with repeats). A client with 0 samples yields no batches. Every :meth:`batches` call starts
    from a fresh permutation: the paper reshuffles each round (docs/algorithms.md, training protocol).
    """

    def __init__(
        self,
        x_uint8: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        generator: torch.Generator,
        augment: bool = False,
        normalize: Normalize | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if x_uint8.dtype not in (torch.uint8, torch.float32) or x_uint8.ndim != 4:
            raise ValueError(f"x must be uint8 or float32 N x C x H x W, got {x_uint8.dtype} {tuple(x_uint8.shape)}")
        if len(y) != len(x_uint8):
            raise ValueError(f"x has {len(x_uint8)} samples but y has {len(y)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        device = torch.device(device) if device is not None else x_uint8.device
        self.x = x_uint8.to(device)  # no copy when already there
        self.y = y.to(device)
        self.batch_size = batch_size
        self.generator = generator
        self.augment = augment
        self.scale: tuple[torch.Tensor, torch.Tensor] | None = None
        if normalize is not None:
            mean, std = (
                torch.as_tensor(v, dtype=torch.float32, device=device).view(1, -1, 1, 1) for v in normalize
            )
            self.scale = mean, std

    @property
    def num_samples(self) -> int:
        return len(self.x)

    @property
    def steps_per_epoch(self) -> int:
        """Full batches per pass: ``n // batch_size``, at least 1 for a non-empty client, 0 for none."""
        n = self.num_samples
        return max(1, n // self.batch_size) if n else 0

    def batches(self, k: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Exactly ``k`` (x, y) batches (none for an empty client), starting from a fresh permutation."""
        for idx in self._index(k):
            yield self._batch(idx.to(self.x.device))

    def epochs(self, e: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """All full batches of ``e`` passes: ``e * steps_per_epoch`` (one per pass for a tiny client)."""
        return self.batches(e * self.steps_per_epoch)

    def _index(self, k: int) -> Iterator[torch.Tensor]:
        """The ``k`` batches' sample indices, one permutation held at a time.

        The generator draws all of the round's permutations before any augmentation (the stream every
        golden number comes from), but ``k x batch_size`` indices at once can be more than the machine
        holds (train.local_steps=1000000 with batch_size=4000: 32 GB). So the permutations are drawn and
        dropped to move the generator past them, then drawn again, one at a time as batches need them,
        from a copy of the generator's state before them: the same indices, twice the ``randperm`` time.
        """
        n, b = self.num_samples, self.batch_size
        if n == 0 or k <= 0:
            return
        # Indices each permutation contributes: whole batches only, or all of it when n < b (wrap).
        used = (n // b) * b or n
        g = self.generator
        again = torch.Generator(device=g.device)
        again.set_state(g.get_state())
        for _ in range(-(-k * b // used)):  # ceil
            torch.randperm(n, generator=g, device=g.device)
        pending = torch.empty(0, dtype=torch.int64, device=g.device)
        for _ in range(k):
            chunks, have = [pending], len(pending)
            while have < b:  # joined once: a batch of many permutations of a small client grew quadratically
                chunks.append(torch.randperm(n, generator=again, device=g.device)[:used])
                have += len(chunks[-1])
            pending = torch.cat(chunks)
            idx, pending = pending[:b], pending[b:]
            yield idx

    def _batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x.index_select(0, idx)
        x = augment_batch(x, self.generator) if self.augment else to_float(x)
        if self.scale is not None:
            x = (x - self.scale[0]) / self.scale[1]
        return x, self.y.index_select(0, idx)
