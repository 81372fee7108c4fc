"""The batch path (fedsim/data/batches.py): crop + flip augmentation against a per-sample reference and as a
property, its draws, ``to_float``; BatchStream's full batches over consecutive permutations (drop_last, wrapping
for a small client, none for an empty one), its random stream, normalisation, and its memory."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsim.data.batches import BatchStream, augment_batch, crop_flip, draw_crop_flip, to_float

# ----------------------------------------------------------------- augmentation


def reference_crop_flip(x: torch.Tensor, offsets: torch.Tensor, flip: torch.Tensor, p: int) -> torch.Tensor:
    """The per-sample loop that crop_flip vectorises."""
    h, w = x.shape[2:]
    out = []
    for img, (dy, dx), f in zip(x, offsets.tolist(), flip.tolist(), strict=True):
        crop = F.pad(img, (p, p, p, p))[:, dy : dy + h, dx : dx + w]
        out.append(crop.flip(2) if f else crop)
    return torch.stack(out)


def test_augment_batch_matches_the_per_sample_reference() -> None:
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    out = augment_batch(x, torch.Generator().manual_seed(7))
    offsets, flip = draw_crop_flip(64, 4, torch.Generator().manual_seed(7))  # the same draws
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert 0.0 <= out.min() and out.max() <= 1.0
    assert torch.equal(out, to_float(reference_crop_flip(x, offsets, flip, 4)))


def test_augment_batch_outputs_are_shifted_possibly_flipped_inputs() -> None:
    # Property-wise, independent of how the draws are made: every output is one of the 9 x 9 x 2
    # zero-padded shifts/flips of its input, and shifts cover -4..4 and flips happen about half the time.
    x = torch.randint(1, 256, (200, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    out = (augment_batch(x, torch.Generator().manual_seed(3)) * 255).round().to(torch.uint8)
    padded = F.pad(x, (4, 4, 4, 4))
    found = []
    for i in range(len(x)):
        matches = [
            (dy - 4, dx - 4, f)
            for dy in range(9)
            for dx in range(9)
            for f in (False, True)
            if torch.equal(out[i], (lambda c: c.flip(2) if f else c)(padded[i, :, dy : dy + 8, dx : dx + 8]))
        ]
        assert matches, f"sample {i} is no shift/flip of its input"
        found.append(matches[0])
    assert {s[0] for s in found} == set(range(-4, 5)) and {s[1] for s in found} == set(range(-4, 5))
    assert 0.35 < np.mean([s[2] for s in found]) < 0.65


def test_augment_draws_are_uniform_and_flip_half_the_time() -> None:
    offsets, flip = draw_crop_flip(20000, 4, torch.Generator().manual_seed(0))
    assert offsets.min() == 0 and offsets.max() == 8
    assert abs(flip.float().mean().item() - 0.5) < 0.02
    counts = torch.bincount(offsets.flatten(), minlength=9).float() / offsets.numel()
    assert (counts - 1 / 9).abs().max() < 0.01


def test_augment_is_deterministic_per_seed_and_generalises_to_other_sizes() -> None:
    x = torch.randint(0, 256, (16, 1, 20, 28), dtype=torch.uint8)
    a = augment_batch(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, augment_batch(x, torch.Generator().manual_seed(5)))
    assert not torch.equal(a, augment_batch(x, torch.Generator().manual_seed(6)))
    assert a.shape == (16, 1, 20, 28)
    offsets, flip = draw_crop_flip(16, 2, torch.Generator().manual_seed(9))
    assert torch.equal(crop_flip(x, offsets, flip, 2), reference_crop_flip(x, offsets, flip, 2))


def test_to_float_is_x_over_255() -> None:
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16)
    assert torch.equal(to_float(x), x.double().div(255).float())


# ----------------------------------------------------------------- BatchStream


def stream(n: int, batch_size: int = 32, seed: int = 0, **kwargs: object) -> BatchStream:
    x = torch.arange(n, dtype=torch.int64).remainder(256).to(torch.uint8).view(n, 1, 1, 1).expand(n, 3, 4, 4)
    y = torch.arange(n)  # labels double as sample ids
    return BatchStream(x.contiguous(), y, batch_size, torch.Generator().manual_seed(seed), **kwargs)


def ids(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[list[int]]:
    return [y.tolist() for _, y in batches]


def test_stream_yields_exactly_k_full_batches() -> None:
    got = list(stream(100).batches(7))
    assert len(got) == 7
    assert all(x.shape == (32, 3, 4, 4) and x.dtype == torch.float32 and y.shape == (32,) for x, y in got)


def test_stream_drop_last_walks_whole_permutations() -> None:
    # n = 70, batch 32: each permutation gives 2 batches (64 distinct samples); 6 are skipped.
    b = ids(list(stream(70).batches(6)))
    for p in range(3):
        perm = b[2 * p] + b[2 * p + 1]
        assert len(set(perm)) == 64 and set(perm) <= set(range(70))


def test_stream_exact_multiple_sees_every_sample_once_per_permutation() -> None:
    b = ids(list(stream(96).batches(6)))
    assert sorted(sum(b[:3], [])) == list(range(96)) and sorted(sum(b[3:], [])) == list(range(96))


def test_stream_smaller_than_a_batch_wraps_across_permutations() -> None:
    b = ids(list(stream(5, batch_size=8).batches(3)))
    flat = sum(b, [])
    assert [len(x) for x in b] == [8, 8, 8]
    for p in range(4):  # 24 draws = four whole permutations of 5, then 4 of a fifth
        assert sorted(flat[5 * p : 5 * p + 5]) == list(range(5))


def test_stream_empty_client_yields_nothing() -> None:
    s = stream(0)
    assert list(s.batches(10)) == [] and list(s.epochs(2)) == [] and s.steps_per_epoch == 0


def test_stream_reshuffles_on_every_call_and_is_deterministic() -> None:
    s = stream(64)
    first, second = ids(list(s.batches(2))), ids(list(s.batches(2)))
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(64))
    assert first != second  # a fresh permutation per call (round), not a continued one
    again = stream(64)
    assert ids(list(again.batches(2))) == first and ids(list(again.batches(2))) == second


def test_stream_epochs_count_full_batches() -> None:
    assert len(list(stream(70).epochs(3))) == 6
    assert len(list(stream(5, batch_size=8).epochs(2))) == 2  # one wrapped batch per pass
    b = ids(list(stream(96).epochs(1)))
    assert sorted(sum(b, [])) == list(range(96))


def test_stream_augment_and_normalize() -> None:
    plain = stream(64, seed=1)
    normed = stream(64, seed=1, normalize=([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]))
    (x0, _), (x1, _) = next(plain.batches(1)), next(normed.batches(1))
    assert torch.allclose(x1, (x0 - 0.5) / 0.25)
    augmented = stream(64, seed=1, augment=True)
    xa, ya = next(augmented.batches(1))
    assert xa.shape == x0.shape and not torch.equal(xa, x0)
    for a, v in zip(xa, x0[:, 0, 0, 0], strict=True):  # flat images: a shifted crop shows v or padding
        assert set(a.unique().tolist()) <= {0.0, v.item()}
    assert torch.equal(ya, next(stream(64, seed=1).batches(1))[1])  # augmentation draws come after the index


@pytest.mark.parametrize(("n", "batch_size", "k"), [(70, 32, 6), (96, 32, 7), (5, 8, 3), (64, 64, 2), (33, 32, 4)])
def test_stream_draws_every_permutation_first_then_augments(n: int, batch_size: int, k: int) -> None:
    # The random stream of every golden number: all the round's permutations first, then each batch's
    # augmentation, in order. Drawn here up front, as fedsim drew it before its index became lazy.
    g = torch.Generator().manual_seed(7)
    used = (n // batch_size) * batch_size or n
    perms = [torch.randperm(n, generator=g)[:used] for _ in range(-(-k * batch_size // used))]
    index = torch.cat(perms)[: k * batch_size].view(k, batch_size)
    want = [augment_batch(stream(n).x.index_select(0, idx), g) for idx in index]
    got = list(stream(n, batch_size, seed=7, augment=True).batches(k))
    assert [y.tolist() for _, y in got] == index.tolist()
    assert all(torch.equal(x, w) for (x, _), w in zip(got, want, strict=True))


@pytest.mark.slow
def test_stream_holds_one_permutation_not_the_rounds_whole_index() -> None:
    # train.local_steps=1000000 with batch_size=4000 built 32 GB of indices before the first step; here
    # 100,000 steps of 500 (400 MB of int64 indices up front, 800 MB at the peak) in a fresh process
    code = (
        "import resource, torch\n"
        "from fedsim.data.batches import BatchStream\n"
        "x, y = torch.zeros(500, 1, 2, 2, dtype=torch.uint8), torch.zeros(500, dtype=torch.int64)\n"
        "s = BatchStream(x, y, 500, torch.Generator().manual_seed(0))\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "batches = s.batches(100_000)\n"
        "first = next(batches)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"  # MiB (Linux: KiB)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert int(out.stdout) < 100, f"the first batch took {out.stdout.strip()} MiB more memory"


# ----------------------------------------------------------------- inputs and sizes


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("float64", "x must be uint8 or float32 N x C x H x W, got torch.float64 (4, 1, 2, 2)"),
        ("3-d", "x must be uint8 or float32 N x C x H x W, got torch.uint8 (4, 2, 2)"),
        ("labels", "x has 4 samples but y has 3"),
        ("batch", "batch_size must be >= 1, got 0"),
    ],
)
def test_stream_refuses_what_it_cannot_batch(case: str, message: str) -> None:
    x, y, batch_size = torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.arange(4), 2
    if case == "float64":
        x = x.double()
    elif case == "3-d":
        x = x[:, 0]
    elif case == "labels":
        y = y[:3]
    else:
        batch_size = 0
    with pytest.raises(ValueError) as err:
        BatchStream(x, y, batch_size, torch.Generator().manual_seed(0))
    assert str(err.value) == message


@pytest.mark.parametrize(("n", "batch_size", "steps"), [(70, 32, 2), (96, 32, 3), (31, 32, 1), (5, 8, 1), (0, 8, 0)])
def test_steps_per_epoch_counts_full_batches_at_least_one_for_a_client_with_data(
    n: int, batch_size: int, steps: int
) -> None:
    s = stream(n, batch_size)
    assert s.num_samples == n and s.steps_per_epoch == steps


def test_float32_features_are_batched_as_they_are() -> None:
    """A dataset generated per client holds float32 features: neither divided by 255 nor copied by to_float."""
    x = (torch.arange(30, dtype=torch.float32) / 7).view(10, 1, 1, 3)
    assert to_float(x) is x
    got = list(BatchStream(x, torch.arange(10), 4, torch.Generator().manual_seed(0)).batches(5))
    assert len(got) == 5
    for xb, yb in got:  # labels are sample ids: each row is its sample's features, unscaled
        assert xb.dtype == torch.float32 and torch.equal(xb.flatten(1), torch.stack([x[i].flatten() for i in yb]))
