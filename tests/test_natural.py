"""The natural partition (partitions/natural.py): each client's own samples of a dataset generated per client; it
splits no loaded dataset, and says which partitioners do. Its use on a generated dataset, and the refusal in a
run: tests/test_generated.py, tests/test_resolve.py."""

from __future__ import annotations

import pytest

from fedsim.errors import DataError
from fedsim.partitions import PARTITIONERS
from fedsim.partitions.natural import NaturalPartitioner
from tests.test_partitions import split


@pytest.mark.parametrize("num_clients", [1, 10, 1000])
def test_natural_splits_no_loaded_dataset_and_names_what_does(num_clients: int) -> None:
    assert PARTITIONERS.get("natural") is NaturalPartitioner
    with pytest.raises(DataError) as err:
        split("natural", num_clients, seed=0)
    assert str(err.value) == (
        "partition 'natural' takes each client's own samples from a dataset generated per client (synthetic); a loaded "
        "dataset is split by a partitioner: dirichlet, n_class, iid, ... (fedsim list partitions)"
    )
