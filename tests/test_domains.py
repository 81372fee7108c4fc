"""Domain-wise clients (LN-FL Table 5): the ``domains`` / ``pacs`` loaders on a generated PACS-like tree
(<domain>/<class>/*.png), the ``domains`` partitioner, a run on it, and the missing-PACS error."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsim.app.cli import main
from fedsim.config_file import parse_config
from fedsim.data import load_dataset
from fedsim.data.domains import in_test_split
from fedsim.engines.runner import run
from fedsim.errors import DataError
from fedsim.partitions import PARTITIONERS, Labels, Partition
from tests.conftest import MNIST_SMALL, small_config, write_config

DOMAINS = ["art_painting", "cartoon", "photo", "sketch"]
CLASSES = ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]
PER_CELL = 8  # images per (domain, class): 224 in all


def png(domain: int, cls: int, i: int) -> bytes:
    """An 8x8 image whose pixels say where it belongs: R = 40 * domain, G = 30 * class, B = i."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (40 * domain, 30 * cls, i)).save(buf, format="PNG")
    return buf.getvalue()


def tree_files(wrapper: str = "") -> dict[str, bytes]:
    return {
        f"{wrapper}{d}/{c}/{c}_{i}.png": png(di, ci, i)
        for di, d in enumerate(DOMAINS) for ci, c in enumerate(CLASSES) for i in range(PER_CELL)
    }  # fmt: skip


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pacs") / "kfold"
    for name, data in tree_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def load(root: Path, cache: Path, **options: object):
    return load_dataset("pacs", root, cache_dir=cache, options=options)


def test_loader_records_domain_and_class_of_every_image(tree: Path, tmp_path: Path) -> None:
    ds = load(tree, tmp_path / "cache")
    assert ds.classes == CLASSES and ds.domains == DOMAINS and ds.in_shape == (3, 8, 8)
    assert len(ds.y_train) + len(ds.y_test) == len(DOMAINS) * len(CLASSES) * PER_CELL
    for x, y, d in ((ds.x_train, ds.y_train, ds.d_train), (ds.x_test, ds.y_test, ds.d_test)):
        assert d is not None
        # the pixels were written from (domain, class): every label and domain matches its image
        assert torch.equal(x[:, 0, 0, 0].long(), 40 * d) and torch.equal(x[:, 1, 0, 0].long(), 30 * y)
    # the hash split: ~20% test, decided by each image's <domain>/<class>/<file> path alone
    expected_test = sum(in_test_split(name, 0.2) for name in tree_files())
    assert len(ds.y_test) == expected_test and 20 < expected_test < 70
    again = load(tree, tmp_path / "cache")  # from the cache, with the domains
    assert again.domains == DOMAINS and again.d_test is not None and torch.equal(again.d_test, ds.d_test)


def test_the_split_does_not_depend_on_the_copy(tree: Path, tmp_path: Path) -> None:
    archive = tmp_path / "PACS.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in reversed(tree_files("PACS/kfold/").items()):  # two wrapper folders, other order
            zf.writestr(name, data)
    a, b = load(tree, tmp_path / "c1"), load(archive, tmp_path / "c2")
    for split in ("x_train", "y_train", "d_train", "x_test", "y_test", "d_test"):
        assert torch.equal(getattr(a, split), getattr(b, split))
    assert load(tree, tmp_path / "c3", size=16).in_shape == (3, 16, 16)


def split(ds, num_clients: int, **params: object) -> Partition:
    cls = PARTITIONERS.get("domains")
    labels = Labels(ds.y_train.numpy(), ds.y_test.numpy(), len(CLASSES), tuple(DOMAINS), ds.d_train.numpy(),
                    ds.d_test.numpy())  # fmt: skip
    return cls(cls.Params(**params)).split(labels, num_clients, np.random.default_rng(0))


@pytest.mark.parametrize("params", [{}, {"within": "dirichlet", "beta": 0.5, "clients_per_domain": 3}])
def test_every_client_holds_one_domain_and_every_domain_is_used_once(tree: Path, tmp_path: Path, params) -> None:
    ds = load(tree, tmp_path / "cache")
    k = params.get("clients_per_domain", 1)
    part = split(ds, 4 * k, **params)
    for which in ("train", "test"):
        d = getattr(ds, f"d_{which}").numpy()
        parts = getattr(part, which)
        for client, idx in enumerate(parts):
            assert set(d[idx]) <= {client // k}  # clients d*k .. d*k+k-1 hold domain d (sorted names)
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(d)))  # each sample once
    if k == 1:  # one client per domain: all of it
        assert [len(p) for p in part.train] == [int((ds.d_train == i).sum()) for i in range(4)]


def test_two_two_three_disjoint_classes_per_domain(tree: Path, tmp_path: Path) -> None:
    ds = load(tree, tmp_path / "cache")
    part = split(ds, 12, clients_per_domain=3, within="classes")
    y = ds.y_train.numpy()
    for domain in range(4):
        sets = [set(y[part.train[3 * domain + j]]) for j in range(3)]
        assert sorted(map(len, sets)) == [2, 2, 3] and set().union(*sets) == set(range(7))
        assert all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1 :])
        for j in range(3):  # the test split follows: the same classes, from the same domain
            assert set(ds.y_test.numpy()[part.test[3 * domain + j]]) <= sets[j]


def test_partition_errors_name_what_to_change(tree: Path, tmp_path: Path) -> None:
    ds = load(tree, tmp_path / "cache")
    with pytest.raises(DataError, match=r"\b4 domains\b.*\bclients_per_domain 3\b.*\b12\b.*num_clients\b.*\b10\b"):
        split(ds, 10, clients_per_domain=3)
    cls = PARTITIONERS.get("domains")
    with pytest.raises(DataError, match=r"\bdata\.dataset\b.*\bpacs\b"):  # wording: tests/test_bad_inputs.py
        cls(cls.Params()).split(Labels(np.zeros(8, np.int64), np.zeros(2, np.int64), 2), 2, np.random.default_rng(0))


def test_a_run_on_domain_clients(tree: Path, tmp_path: Path) -> None:
    cfg = small_config(
        tmp_path, data={"dataset": {"name": "pacs"}, "root": str(tree), "cache_dir": str(tmp_path / "cache")},
        train={"num_clients": 4, "rounds": 2}, eval={"every": 2},
    )  # fmt: skip
    cfg["partition"] = {"name": "domains"}
    run_dir = Path(run(parse_config(cfg))["run_dir"])
    rows = (run_dir / "partition.csv").read_text().splitlines()
    assert rows[0] == "split,client," + ",".join(CLASSES) + ",total" and len(rows) == 1 + 2 * 4
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["round"] == 2 and len(last["client_acc"]) == 4


def test_domains_partition_on_a_dataset_without_domains_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = {**small_config(tmp_path, data={"root": str(MNIST_SMALL)}), "partition": {"name": "domains"}}
    assert main(["run", str(write_config(tmp_path, cfg))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedsim: error: partition 'domains'") and "data.dataset" in err[0], err
