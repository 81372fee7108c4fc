"""Dataset loaders (npz, imagefolder, torchvision), the decode cache, augmentation and BatchStream."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from fedsim.data import ASSETS_DIR, DATASETS, ArrayDataset, load_dataset
from fedsim.data.batches import BatchStream, augment_batch, crop_flip, draw_crop_flip, to_float
from fedsim.errors import ConfigError, DataError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
CIFAR_Q75 = SHARED / "cifar10_jpg_q75.tar.gz"


# ---------------------------------------------------------------------------- npz


def write_npz(path: Path, **overrides: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (6, 5, 4), dtype=np.uint8),
        "y_train": np.array([0, 1, 2, 0, 1, 2], dtype=np.uint8),  # Keras MNIST labels are uint8
        "x_test": rng.integers(0, 256, (3, 5, 4), dtype=np.uint8),
        "y_test": np.array([2, 1, 0], dtype=np.int64),
    }
    arrays.update(overrides)
    np.savez(path, **arrays)
    return arrays


def test_npz_grayscale_round_trip(tmp_path: Path) -> None:
    a = write_npz(tmp_path / "tiny.npz")
    ds = load_dataset("npz", tmp_path / "tiny.npz")
    assert ds.x_train.shape == (6, 1, 5, 4) and ds.x_test.shape == (3, 1, 5, 4)
    assert ds.x_train.dtype == torch.uint8 and ds.x_train.is_contiguous()
    assert ds.y_train.dtype == torch.int64
    assert np.array_equal(ds.x_train[:, 0].numpy(), a["x_train"])
    assert ds.y_train.tolist() == [0, 1, 2, 0, 1, 2] and ds.y_test.tolist() == [2, 1, 0]
    assert ds.classes == ["0", "1", "2"] and ds.num_classes == 3 and ds.in_shape == (1, 5, 4)
    assert ds.name == "tiny"


def test_npz_channels_last_with_classes_and_column_labels(tmp_path: Path) -> None:
    x = np.arange(2 * 3 * 4 * 3, dtype=np.uint8).reshape(2, 3, 4, 3)  # N x H x W x C
    write_npz(
        tmp_path / "rgb.npz",
        x_train=x,
        x_test=x,
        y_train=np.array([[1], [0]]),
        y_test=np.array([[0], [1]]),
        classes=np.array(["cat", "dog"]),
    )
    ds = load_dataset("npz", str(tmp_path / "rgb.npz"))
    assert ds.x_train.shape == (2, 3, 3, 4) and ds.x_train.is_contiguous()
    assert np.array_equal(ds.x_train.numpy(), x.transpose(0, 3, 1, 2))
    assert ds.y_train.tolist() == [1, 0] and ds.classes == ["cat", "dog"]


def test_npz_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=str(tmp_path / "nope.npz")):
        load_dataset("npz", tmp_path / "nope.npz")


def test_npz_missing_keys_are_named(tmp_path: Path) -> None:
    np.savez(tmp_path / "half.npz", x_train=np.zeros((1, 2, 2), np.uint8), y_train=np.zeros(1))
    with pytest.raises(DataError, match=r"\['x_test', 'y_test'\]") as err:
        load_dataset("npz", tmp_path / "half.npz")
    assert str(tmp_path / "half.npz") in str(err.value)


def test_npz_rejects_float_images(tmp_path: Path) -> None:
    write_npz(tmp_path / "f.npz", x_train=np.zeros((6, 5, 4), np.float32))
    with pytest.raises(DataError, match="x_train"):
        load_dataset("npz", tmp_path / "f.npz")


@pytest.mark.parametrize(
    ("key", "shape"),
    [("x_train", (6, 3, 5, 5)), ("x_train", (6, 1, 28, 28)), ("x_test", (3, 4, 5, 5)), ("x_test", (3, 3, 32, 32))],
)
def test_npz_channels_first_is_refused_naming_the_array_and_the_layout(
    tmp_path: Path, key: str, shape: tuple[int, ...]
) -> None:
    """(N, 3, 32, 32) read as 3-pixel-high images of 32 channels: an mlp trained on it in silence, a cnn said the
    images were too small. The array, its shape and the layout fedsim reads are named."""
    other = {"x_train": (6, 5, 5, 3), "x_test": (3, 5, 5, 3)}
    other[key] = shape
    write_npz(tmp_path / "nchw.npz", **{k: np.zeros(v, np.uint8) for k, v in other.items()})
    with pytest.raises(DataError) as err:
        load_dataset("npz", tmp_path / "nchw.npz")
    message = str(err.value)  # its wording: tests/test_bad_inputs.py
    assert f"{key}: " in message and str(shape) in message
    assert str((shape[0], *shape[2:], shape[1])) in message  # the shape to store them as


@pytest.mark.parametrize("shape", [(5, 4), (5, 4, 1), (3, 3, 3), (5, 4, 4), (5, 5, 2), (1, 3, 3), (1, 28, 1)])
def test_npz_every_channels_last_layout_still_reads(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """Grayscale (N, H, W), and (N, H, W, C) whatever H is when C is a channel count (or H is none)."""
    write_npz(tmp_path / "nhwc.npz", x_train=np.zeros((6, *shape), np.uint8), x_test=np.zeros((3, *shape), np.uint8))
    ds = load_dataset("npz", tmp_path / "nhwc.npz")
    assert ds.in_shape == ((1, *shape) if len(shape) == 2 else (shape[2], shape[0], shape[1]))


def test_npz_big_endian_arrays_read_as_their_values(tmp_path: Path) -> None:
    """Labels stored big-endian ('>i8', as another machine may write them) were refused with torch's message,
    which named no array; they are the same integers in native byte order."""
    a = write_npz(tmp_path / "be.npz", y_train=np.array([0, 1, 2, 0, 1, 2], ">i8"), y_test=np.array([2, 1, 0], ">u2"))
    ds = load_dataset("npz", tmp_path / "be.npz")
    assert ds.y_train.tolist() == a["y_train"].tolist() and ds.y_test.tolist() == [2, 1, 0]
    write_npz(tmp_path / "bef.npz", x_train=np.zeros((6, 5, 4), ">f4"))
    with pytest.raises(DataError, match="x_train: "):
        load_dataset("npz", tmp_path / "bef.npz")


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "esc\x1b[31m", "line\u2028sep"])
def test_class_names_with_a_control_character_are_refused(tmp_path: Path, name: str) -> None:
    """A class folder named 'a<newline>b' was accepted and broke partition.csv's header and the plot's labels;
    an npz's classes the same. Refused in one line quoting the name."""
    name = name.encode().decode("unicode_escape")
    files = {f"{split}/{cls}/{i}.png": png_bytes((i, 0, 0)) for split in ("train", "test") for cls in (name, "b")
             for i in range(2)}  # fmt: skip
    for root in (write_dir(tmp_path / "tree", files), write_tar(tmp_path / "tree.tar", files, "w")):
        with pytest.raises(DataError) as err:
            load_dataset("imagefolder", root, cache_dir=tmp_path / "cache")
        assert repr(name) in str(err.value) and "\n" not in str(err.value)  # its wording: tests/test_bad_inputs.py
    write_npz(tmp_path / "c.npz", classes=np.array([name, "b", "c"]))
    with pytest.raises(DataError) as err:
        load_dataset("npz", tmp_path / "c.npz")
    assert repr(name) in str(err.value) and "\n" not in str(err.value)


def test_unknown_dataset_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"^data\.dataset\.name: .*'no_such_set'.*imagefolder"):
        load_dataset("no_such_set", ".")


def test_every_loader_has_a_summary_for_fedsim_list() -> None:
    names = {e.name for e in DATASETS}
    assert {"mnist", "fashion_mnist", "cifar10", "cifar100", "npz", "imagefolder"} <= names
    assert all(e.summary for e in DATASETS)


def test_array_dataset_rejects_labels_out_of_range() -> None:
    x = torch.zeros(2, 1, 2, 2, dtype=torch.uint8)
    with pytest.raises(DataError, match=r"y_train.*\[0, 2\]"):  # the split and its labels' range
        ArrayDataset(x, torch.tensor([0, 2]), x, torch.tensor([0, 1]), ["a", "b"], "bad")


# ----------------------------------------------------------------- torchvision


def test_torchvision_missing_files_say_where_and_how(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "cifar-10-batches-py") in msg
    assert "data.download: true" in msg and "npz" in msg and "imagefolder" in msg


def test_torchvision_mnist_from_idx_files(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images = {"train": np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256, "t10k": np.full((2, 28, 28), 7)}
    labels = {"train": [3, 1, 4], "t10k": [1, 5]}
    for split in ("train", "t10k"):
        x = images[split].astype(np.uint8)
        (raw / f"{split}-images-idx3-ubyte").write_bytes(
            struct.pack(">iiii", 2051, len(x), 28, 28) + x.tobytes()
        )
        y = bytes(labels[split])
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, len(y)) + y)
    ds = load_dataset("mnist", tmp_path)
    assert ds.x_train.shape == (3, 1, 28, 28) and ds.x_test.shape == (2, 1, 28, 28)
    assert np.array_equal(ds.x_train[:, 0].numpy(), images["train"].astype(np.uint8))
    assert ds.y_train.tolist() == [3, 1, 4] and ds.y_test.tolist() == [1, 5] and ds.num_classes == 10


# ----------------------------------------------------------------- imagefolder

CLASSES = ["bird", "cat", "dog"]  # created below out of sorted order: labels must follow sorted names


def pixel(split: str, label: int, i: int) -> tuple[int, int, int]:
    return (10 * label + i, 100 + (split == "test"), 200 + i)


def png_bytes(rgb: tuple[int, int, int], size: tuple[int, int] = (5, 4)) -> bytes:
    buf = io.BytesIO()
    img = Image.new("RGB", size, rgb)
    img.putpixel((0, 0), (255, 0, 0))  # not flat: catches transposed H/W
    img.save(buf, format="PNG")
    return buf.getvalue()


def tree_files(prefix: str = "") -> dict[str, bytes]:
    files = {}
    for split, n in (("train", 3), ("test", 2)):
        for label in (2, 0, 1):
            for i in range(n):
                files[f"{prefix}{split}/{CLASSES[label]}/{i:02d}.png"] = png_bytes(pixel(split, label, i))
    files[f"{prefix}README.txt"] = b"not an image"
    return files


def write_tar(path: Path, files: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_dir(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def check_tree(ds: ArrayDataset) -> None:
    assert ds.classes == CLASSES
    assert ds.x_train.shape == (9, 3, 4, 5) and ds.x_test.shape == (6, 3, 4, 5)  # 5 wide, 4 high
    assert ds.x_train.dtype == torch.uint8 and ds.x_train.is_contiguous()
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and ds.y_test.tolist() == [0, 0, 1, 1, 2, 2]
    for split, x, y in (("train", ds.x_train, ds.y_train), ("test", ds.x_test, ds.y_test)):
        for j, label in enumerate(y.tolist()):
            i = j % (3 if split == "train" else 2)
            assert x[j, :, 0, 0].tolist() == [255, 0, 0]
            assert (x[j, :, 1:, 1:] == torch.tensor(pixel(split, label, i)).view(3, 1, 1)).all()


def test_imagefolder_from_tar_gz_with_wrapping_directory(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "tiny.tar.gz", tree_files("tiny/"))
    ds = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    check_tree(ds)
    assert ds.name == "tiny"


def test_imagefolder_from_plain_tar(tmp_path: Path) -> None:
    check_tree(
        load_dataset("imagefolder", write_tar(tmp_path / "t.tar", tree_files(), "w"), cache_dir=tmp_path)
    )


def test_imagefolder_from_directory(tmp_path: Path) -> None:
    root = write_dir(tmp_path / "tree", tree_files())
    check_tree(load_dataset("imagefolder", root, cache_dir=tmp_path / "cache"))


def test_imagefolder_cache_hit_skips_the_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = write_tar(tmp_path / "tiny.tar.gz", tree_files())
    first = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1
    assert not list((tmp_path / "cache").glob("*.tmp"))

    def no_tar(*args: object, **kwargs: object) -> None:
        raise AssertionError("the archive was read despite a cache")

    monkeypatch.setattr(tarfile, "open", no_tar)
    second = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(first, field), getattr(second, field))
    assert second.classes == first.classes


def test_imagefolder_changed_archive_is_decoded_again(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "tiny.tar.gz", tree_files())
    load_dataset("imagefolder", archive, cache_dir=tmp_path)
    files = tree_files()
    files["train/cat/99.png"] = png_bytes((1, 2, 3))
    write_tar(archive, files)
    os.utime(archive, ns=(0, 10**18))  # a new mtime even on a coarse-clock filesystem
    assert len(load_dataset("imagefolder", archive, cache_dir=tmp_path).y_train) == 10


def test_imagefolder_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "envcache"))
    load_dataset("imagefolder", write_tar(tmp_path / "t.tar.gz", tree_files()))
    assert len(list((tmp_path / "envcache").glob("imagefolder-t-*.npz"))) == 1


@pytest.mark.parametrize("cache", ["a\nb", "a\tb", "a\udcffb"])
def test_a_fedsim_cache_that_data_cache_dir_would_refuse_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: str
) -> None:
    # a mapping, not the process's environment: a lone surrogate cannot be put into that one
    monkeypatch.setattr(os, "environ", {**os.environ, "FEDSIM_CACHE": str(tmp_path / cache)})
    with pytest.raises(ConfigError, match="^FEDSIM_CACHE "):
        load_dataset("imagefolder", write_tar(tmp_path / "t.tar.gz", tree_files()))
    assert not (tmp_path / cache).exists()  # nothing made under the name


def test_imagefolder_mixed_sizes_name_an_offender(tmp_path: Path) -> None:
    files = tree_files()
    files["test/dog/99.png"] = png_bytes((0, 0, 0), size=(6, 4))
    with pytest.raises(DataError, match=r"test/dog/99\.png.*6x4"):
        load_dataset("imagefolder", write_tar(tmp_path / "bad.tar.gz", files), cache_dir=tmp_path)


def test_imagefolder_without_test_split_explains_the_layout(tmp_path: Path) -> None:
    files = {k: v for k, v in tree_files().items() if not k.startswith("test/")}
    with pytest.raises(DataError, match=r"t\.tar\.gz.*\btest\b"):  # the archive and the split; the wording: the corpus
        load_dataset("imagefolder", write_tar(tmp_path / "t.tar.gz", files), cache_dir=tmp_path)


def test_imagefolder_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=str(tmp_path / "gone.tar.gz")):
        load_dataset("imagefolder", tmp_path / "gone.tar.gz", cache_dir=tmp_path)


def test_imagefolder_decodes_jpeg_like_pillow(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    files, expected = {}, {}
    for split in ("train", "test"):
        for cls in ("a", "b"):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, "JPEG", quality=75)
            files[f"{split}/{cls}/0.jpg"] = buf.getvalue()
            expected[split, cls] = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    ds = load_dataset("imagefolder", write_tar(tmp_path / "j.tar.gz", files), cache_dir=tmp_path)
    for j, cls in enumerate(("a", "b")):
        assert np.array_equal(ds.x_train[j].permute(1, 2, 0).numpy(), expected["train", cls])


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


# ----------------------------------------------------------------- shipped data


def test_shipped_mnist_small_is_balanced_and_small() -> None:
    path = ASSETS_DIR / "mnist_small.npz"
    assert path.stat().st_size <= 5 * 1024 * 1024
    ds = load_dataset("npz", path)
    assert ds.x_train.shape == (5000, 1, 28, 28) and ds.x_test.shape == (1000, 1, 28, 28)
    assert torch.bincount(ds.y_train).tolist() == [500] * 10
    assert torch.bincount(ds.y_test).tolist() == [100] * 10
    assert ds.classes == [str(i) for i in range(10)]
    assert ds.x_train.float().mean() > 10  # real digits, not zeros


@pytest.mark.slow
@pytest.mark.long
def test_real_cifar10_q75_archive(cifar_cache: Path) -> None:
    if not CIFAR_Q75.is_file():
        pytest.skip(f"{CIFAR_Q75} is absent (see ../shared/datasets/README.md)")
    ds = load_dataset("imagefolder", CIFAR_Q75, cache_dir=cifar_cache)
    names = "airplane automobile bird cat deer dog frog horse ship truck".split()
    assert ds.classes == names
    assert ds.x_train.shape == (50000, 3, 32, 32) and ds.x_test.shape == (10000, 3, 32, 32)
    assert torch.bincount(ds.y_train).tolist() == [5000] * 10
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10
    mean = ds.x_train.double().mean((0, 2, 3)) / 255
    assert torch.allclose(mean, torch.tensor([0.4913, 0.4821, 0.4465], dtype=torch.float64), atol=2e-3)
