"""Write fedsim/assets/mnist_small.npz: a seeded, class-balanced MNIST subset for the quickstart.

    python scripts/make_quickstart_data.py [--source ../shared/datasets/mnist.npz]

500 train + 100 test images per class (5,000 + 1,000), Keras layout, np.savez_compressed.
The same source and seed always give the same file contents.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT.parent / "shared" / "datasets" / "mnist.npz"
DEFAULT_OUT = ROOT / "fedsim" / "assets" / "mnist_small.npz"
MAX_BYTES = 5 * 1024 * 1024  # shipped inside the wheel: keep it small


def balanced_subset(y: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``per_class`` random samples of every class, sorted (keeps the source's order)."""
    picks = [rng.choice(np.flatnonzero(y == c), per_class, replace=False) for c in np.unique(y)]
    return np.sort(np.concatenate(picks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--train-per-class", type=int, default=500)
    parser.add_argument("--test-per-class", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    with np.load(args.source, allow_pickle=False) as src:
        train = balanced_subset(src["y_train"], args.train_per_class, rng)
        test = balanced_subset(src["y_test"], args.test_per_class, rng)
        arrays = {
            "x_train": src["x_train"][train].astype(np.uint8),
            "y_train": src["y_train"][train].astype(np.int64),
            "x_test": src["x_test"][test].astype(np.uint8),
            "y_test": src["y_test"][test].astype(np.int64),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    size = args.out.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{args.out} is {size / 2**20:.2f} MiB, over the {MAX_BYTES / 2**20:.0f} MiB limit")
    shapes = ", ".join(f"{k} {v.shape}" for k, v in arrays.items())
    print(f"wrote {args.out} ({size / 2**20:.2f} MiB): {shapes}")


if __name__ == "__main__":
    main()
