"""The federation a config describes (fedsim/experiment/federation.py): the input transform every model's batches go
through, a loaded dataset's per-channel statistics, each client's slices and the split itself (the partitioner's,
from a stream fixed by the seed, with the dataset's domains when it has them; a plugin's bug named), a dataset
generated per client as its own federation, and the per-process cache of federations by what the split depends on.
Datasets small enough to check by hand, built here; every expected number computed here in numpy or by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.data import DATASETS, ArrayDataset, DatasetLoader, DataSource
from fedsim.data.generated import GeneratedLoader
from fedsim.errors import DataError
from fedsim.experiment import federation
from fedsim.experiment.federation import Federation, GeneratedFederation, InputTransform, load_federation
from fedsim.partitions import PARTITIONERS, Labels, Partition, Partitioner
from tests.conftest import small_config


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(federation, "_CACHE", {})  # each test counts what it splits, in a cache of its own


def images(n: int, shape: tuple[int, int, int], seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def tiny(domains: bool = False) -> ArrayDataset:
    """40 training and 20 test images of 1x2x2 pixels, 4 classes in turn (and 2 domains in turn)."""
    extra: dict[str, Any] = {}
    if domains:
        extra = {"domains": ["photo", "sketch"], "d_train": torch.arange(40) % 2, "d_test": torch.arange(20) % 2}
    return ArrayDataset(
        images(40, (1, 2, 2), 1), torch.arange(40) % 4, images(20, (1, 2, 2), 2), torch.arange(20) % 4,
        ["a", "b", "c", "d"], "tiny", **extra,
    )  # fmt: skip


class Tiny(DatasetLoader):
    """The dataset it is given, whatever the source; counts its loads."""

    def __init__(self, dataset: ArrayDataset) -> None:
        super().__init__(DatasetLoader.Params())
        self.dataset, self.loads = dataset, 0

    def load(self, source: DataSource) -> ArrayDataset:
        self.loads += 1
        return self.dataset


class Recording(Partitioner):
    """Client 0 gets every sample; the labels it was given are kept, or ``error`` raised."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__(Partitioner.Params())
        self.error, self.seen = error, []

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        self.seen.append(labels)
        if self.error is not None:
            raise self.error
        everything = [np.arange(len(labels.train))] + [np.array([], dtype=np.int64)] * (num_clients - 1)
        return Partition(everything, [np.arange(len(labels.test))] + [np.array([], dtype=np.int64)] * (num_clients - 1))


def config(tmp_path: Path, **sections: Any) -> RunConfig:
    return parse_config(small_config(tmp_path, **sections))


def iid() -> Partitioner:
    return PARTITIONERS.resolve("iid", {}, "partition").create()


# --- the input transform ---------------------------------------------------------------------------------------


def test_uint8_images_become_floats_in_the_unit_interval() -> None:
    x = torch.tensor([0, 51, 102, 255], dtype=torch.uint8).view(1, 1, 2, 2)
    out = InputTransform()(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([0.0, 0.2, 0.4, 1.0]).view(1, 1, 2, 2))


def test_with_statistics_each_channel_is_standardised_by_its_own_mean_and_std() -> None:
    x = torch.tensor([[0, 255], [51, 102]], dtype=torch.uint8).view(1, 2, 1, 2)  # channel 0: 0, 1; 1: 0.2, 0.4
    stats = (torch.tensor([0.5, 0.25]), torch.tensor([0.5, 0.125]))
    out = InputTransform(stats)(x)
    # (0 - .5) / .5, (1 - .5) / .5; (.2 - .25) / .125, (.4 - .25) / .125
    torch.testing.assert_close(out, torch.tensor([[-1.0, 1.0], [-0.4, 1.2]]).view(1, 2, 1, 2))


def test_float_feature_vectors_pass_as_they_are() -> None:
    features = torch.randn(3, 1, 1, 5, generator=torch.Generator().manual_seed(0))
    assert InputTransform()(features) is features


# --- a loaded dataset split among clients ----------------------------------------------------------------------


def federation_of(dataset: ArrayDataset, train: list[list[int]], test: list[list[int]], note: str = "") -> Federation:
    part = Partition([np.array(t, dtype=np.int64) for t in train], [np.array(t, dtype=np.int64) for t in test], note)
    counts = np.zeros((len(train), dataset.num_classes), dtype=np.int64)
    return Federation(dataset, part, counts, counts + 1)


def test_channel_statistics_are_the_training_images_mean_and_sample_std_per_channel() -> None:
    # 5,000 images: more than one chunk of 4,096; the test images count for nothing
    ds = ArrayDataset(images(5000, (3, 2, 2), 3), torch.zeros(5000, dtype=torch.int64), images(7, (3, 2, 2), 4),
                      torch.zeros(7, dtype=torch.int64), ["only"], "rgb")  # fmt: skip
    fed = federation_of(ds, [list(range(5000))], [list(range(7))])
    mean, std = fed.channel_stats
    x = ds.x_train.numpy().astype(np.float64) / 255
    assert mean.dtype == std.dtype == torch.float32 and mean.shape == std.shape == (3,)
    # float64 sums of 20,000 values in [0, 1] rounded to float32: float32's own rounding (rtol 1.3e-6)
    torch.testing.assert_close(mean, torch.from_numpy(x.mean(axis=(0, 2, 3))).float())
    per_channel = x.transpose(1, 0, 2, 3).reshape(3, -1)
    torch.testing.assert_close(std, torch.from_numpy(per_channel.std(axis=1, ddof=1)).float())
    assert fed.channel_stats is fed.channel_stats  # computed once
    assert fed.input_transform(True).stats is fed.channel_stats
    assert fed.input_transform(False).stats is None


@pytest.mark.parametrize("value", [0, 1, 77, 254, 255])
def test_a_channel_under_one_grey_level_of_spread_is_refused_naming_it(value: int) -> None:
    """A sum of squares less n·mean² gave 0, NaN or about 1e-9 for a constant channel, which the inputs were then
    divided by; a channel one pixel off constant has a std of 1/(255·√n), which blew a test image up 10⁴-fold."""
    x = images(5000, (3, 4, 4), 5)
    x[:, 1] = value
    ds = ArrayDataset(x, torch.zeros(5000, dtype=torch.int64), x[:2], torch.zeros(2, dtype=torch.int64), ["c"], "rgb")
    with pytest.raises(DataError, match=rf"^data\.normalize: .*\bchannel 1 holds {value} in every pixel \(std 0\)"):
        federation_of(ds, [list(range(5000))], [[0]]).input_transform(normalize=True)
    x[17, 1, 2, 3] = value + 1 if value < 255 else value - 1  # one pixel of 80,000 one step apart
    n = 5000 * 16  # n - 1 deviations of 1/(255 n) and one of (n - 1)/(255 n): a sum of squares of (n - 1)/(255² n)
    with pytest.raises(DataError, match=rf"\bchannel 1 has std {1 / (255 * n**0.5):.2g}, under one grey level"):
        federation_of(ds, [list(range(5000))], [[0]]).input_transform(normalize=True)


def test_a_channel_one_grey_level_either_side_of_its_mean_is_standardised_by_that_std() -> None:
    x = images(5000, (3, 4, 4), 6)
    x[:, 2] = 100
    x[::2, 2] = 102  # every other image: values 100 and 102, each 1/255 from the mean of 101/255
    ds = ArrayDataset(x, torch.zeros(5000, dtype=torch.int64), x[:2], torch.zeros(2, dtype=torch.int64), ["c"], "rgb")
    mean, std = federation_of(ds, [list(range(5000))], [[0]]).channel_stats
    n = 5000 * 16
    torch.testing.assert_close(mean[2], torch.tensor(101 / 255))
    torch.testing.assert_close(std[2], torch.tensor((n / (n - 1)) ** 0.5 / 255))


def test_a_client_is_its_partitions_rows_of_both_splits() -> None:
    ds = tiny()
    fed = federation_of(ds, [[0, 5, 9], [1, 2]], [[3], [0, 19]])
    one = fed.client(1)
    assert torch.equal(one.x_train, ds.x_train[[1, 2]]) and one.y_train.tolist() == [1, 2]
    assert torch.equal(one.x_test, ds.x_test[[0, 19]]) and one.y_test.tolist() == [0, 3]
    zero = fed.client(0)
    assert torch.equal(zero.x_train, ds.x_train[[0, 5, 9]]) and zero.y_train.tolist() == [0, 1, 1]
    assert torch.equal(zero.x_test, ds.x_test[[3]]) and zero.y_test.tolist() == [3]


def test_a_federation_describes_its_dataset_and_split() -> None:
    fed = federation_of(tiny(), [[0], [1]], [[0], [1]], note="uneven")
    assert (fed.classes, fed.num_classes, fed.in_shape, fed.note) == (["a", "b", "c", "d"], 4, (1, 2, 2), "uneven")
    assert fed.counts is not None
    assert fed.counts[0] is fed.train_counts and fed.counts[1] is fed.test_counts


def test_the_fingerprint_is_the_datasets_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[ArrayDataset] = []
    real = federation.fingerprint
    monkeypatch.setattr(federation, "fingerprint", lambda ds: calls.append(ds) or real(ds))
    ds = tiny()
    fed = federation_of(ds, [[0]], [[0]])
    assert fed.data_sha256 == real(ds) == fed.data_sha256
    assert calls == [ds]


def test_the_split_is_the_partitioners_from_a_stream_fixed_by_the_seed(tmp_path: Path) -> None:
    ds = tiny()
    fed = load_federation(config(tmp_path, seed=5), Tiny(ds), iid())
    assert isinstance(fed, Federation) and fed.dataset is ds
    labels = Labels(ds.y_train.numpy(), ds.y_test.numpy(), 4)
    # the stream every recorded run's split came from: [seed, 0x9A27], apart from any other draw of the run
    expected = iid().split(labels, 4, np.random.default_rng([5, 0x9A27]))
    assert [p.tolist() for p in fed.partition.train] == [p.tolist() for p in expected.train]
    assert [p.tolist() for p in fed.partition.test] == [p.tolist() for p in expected.test]
    assert sorted(np.concatenate(fed.partition.train).tolist()) == list(range(40))  # iid: each sample once
    for pid in range(4):
        y_train, y_test = ds.y_train.numpy(), ds.y_test.numpy()
        assert fed.train_counts[pid].tolist() == np.bincount(y_train[fed.partition.train[pid]], minlength=4).tolist()
        assert fed.test_counts[pid].tolist() == np.bincount(y_test[fed.partition.test[pid]], minlength=4).tolist()
    assert fed.train_counts.sum() == 40 and fed.test_counts.sum() == 20
    other = load_federation(config(tmp_path, seed=6), Tiny(ds), iid())
    assert [p.tolist() for p in other.partition.train] != [p.tolist() for p in fed.partition.train]


@pytest.mark.parametrize("domains", [False, True])
def test_the_partitioner_is_given_the_labels_and_the_domains_of_a_dataset_that_has_them(
    tmp_path: Path, domains: bool
) -> None:
    ds, partitioner = tiny(domains), Recording()
    fed = load_federation(config(tmp_path), Tiny(ds), partitioner)
    (labels,) = partitioner.seen
    assert labels.train.tolist() == [k % 4 for k in range(40)] and labels.test.tolist() == [k % 4 for k in range(20)]
    assert labels.num_classes == 4
    if domains:
        assert labels.domains == ("photo", "sketch")
        assert labels.train_domain is not None and labels.train_domain.tolist() == [k % 2 for k in range(40)]
        assert labels.test_domain is not None and labels.test_domain.tolist() == [k % 2 for k in range(20)]
    else:
        assert (labels.domains, labels.train_domain, labels.test_domain) == ((), None, None)
    assert isinstance(fed, Federation)
    assert fed.train_counts.tolist() == [[10, 10, 10, 10], [0] * 4, [0] * 4, [0] * 4]


def test_a_partitioner_that_raises_is_a_data_error_naming_the_partition(tmp_path: Path) -> None:
    bug = ZeroDivisionError("division by zero")
    with pytest.raises(DataError, match=r"^partition: 'dirichlet' .*ZeroDivisionError") as err:
        load_federation(config(tmp_path), Tiny(tiny()), Recording(bug))
    assert err.value.__cause__ is bug
    assert federation._CACHE == {}  # nothing kept of a split that failed


def test_a_partitioners_own_fedsim_error_passes_as_it_is(tmp_path: Path) -> None:
    refusal = DataError("partition: too few samples for these clients")
    with pytest.raises(DataError) as err:
        load_federation(config(tmp_path), Tiny(tiny()), Recording(refusal))
    assert err.value is refusal


# --- a dataset generated per client ----------------------------------------------------------------------------


def synthetic(tmp_path: Path) -> tuple[RunConfig, GeneratedLoader]:
    options = {"dim": 5, "num_classes": 3}
    cfg = config(tmp_path, data={"dataset": {"name": "synthetic", **options}}, partition="natural",
                 eval={"global_test": False})  # fmt: skip
    loader = DATASETS.resolve("synthetic", options, "data.dataset").create()
    assert isinstance(loader, GeneratedLoader)
    return cfg, loader


def test_a_dataset_generated_per_client_is_its_own_federation(tmp_path: Path) -> None:
    cfg, loader = synthetic(tmp_path)
    partitioner = Recording()
    fed = load_federation(cfg, loader, partitioner)  # loader.load would raise: a generated dataset is never loaded
    assert isinstance(fed, GeneratedFederation) and fed.loader is loader and fed.name == "synthetic"
    assert partitioner.seen == []  # nothing to split
    assert (fed.dataset, fed.counts, fed.note) == (None, None, "")
    assert (fed.classes, fed.num_classes, fed.in_shape) == (["0", "1", "2"], 3, (1, 1, 5))
    for pid in (0, 7, 999_999):
        mine, theirs = fed.client(pid), loader.client(pid)
        assert torch.equal(mine.x_train, theirs.x_train) and torch.equal(mine.y_train, theirs.y_train)
        assert torch.equal(mine.x_test, theirs.x_test) and torch.equal(mine.y_test, theirs.y_test)
    assert fed.data_sha256 == loader.fingerprint()
    assert fed.input_transform(True).stats is None and fed.input_transform(False).stats is None


# --- the cache --------------------------------------------------------------------------------------------------


def test_a_federation_is_split_once_per_data_partition_clients_and_seed(tmp_path: Path) -> None:
    loader = Tiny(tiny())
    first = load_federation(config(tmp_path), loader, iid())
    # what the split does not depend on: the same federation, not read again
    same = [config(tmp_path, name="other", train={"lr": 0.3, "rounds": 9}, model={"hidden": [8]}),
            config(tmp_path, strategy={"name": "fedprox"}, eval={"every": 1}),
            config(tmp_path, data={"augment": True, "normalize": True})]  # per batch, not the split  # fmt: skip
    assert all(load_federation(cfg, loader, iid()) is first for cfg in same)
    assert loader.loads == 1
    # what it does: each a split of its own
    changed = [config(tmp_path, seed=1), config(tmp_path, train={"num_clients": 3}),
               config(tmp_path, partition={"name": "dirichlet", "beta": 0.7}),
               config(tmp_path, data={"root": str(tmp_path)})]  # fmt: skip
    feds = [load_federation(cfg, loader, iid()) for cfg in changed]
    assert len({id(f) for f in [first, *feds]}) == 5 and loader.loads == 5  # each read and split anew
    assert len(feds[1].partition.train) == 3


def test_the_cache_keeps_the_four_federations_used_last(tmp_path: Path) -> None:
    loader = Tiny(tiny())
    configs = [config(tmp_path, seed=s) for s in range(5)]
    feds = [load_federation(cfg, loader, iid()) for cfg in configs]
    assert len(federation._CACHE) == 4 and loader.loads == 5
    assert [load_federation(cfg, loader, iid()) for cfg in configs[1:]] == feds[1:] and loader.loads == 5
    again = load_federation(configs[0], loader, iid())  # the oldest went when the fifth came
    assert again is not feds[0] and loader.loads == 6
    assert [p.tolist() for p in again.partition.train] == [p.tolist() for p in feds[0].partition.train]
