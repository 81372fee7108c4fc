"""The run record's verifier (fedsim.record.verify): a check of the files against each other and against the
checksums the record holds raises FedsimError in one line naming the file, never another exception."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedsim.config_file import parse_config
from fedsim.errors import FedsimError
from fedsim.record.checksums import PARTITION_CHECKSUM, partition_checksum
from fedsim.record.layout import PARTITION, PROGRESS, SUMMARY
from fedsim.record.verify import check_partition
from tests.conftest import small_config

CLASSES = ["0", "1", "2"]


def counts(clients: int) -> dict[str, np.ndarray]:
    return {split: np.arange(clients * len(CLASSES)).reshape(clients, len(CLASSES)) for split in ("train", "test")}


@pytest.mark.parametrize("source", [SUMMARY, PROGRESS])
def test_a_partition_checksum_missing_from_the_record_is_a_refusal_naming_the_partition(
    tmp_path: Path, source: str
) -> None:
    cfg = parse_config(small_config(tmp_path))
    table = counts(cfg.train.num_clients)
    check_partition(tmp_path, cfg, {PARTITION_CHECKSUM: partition_checksum(CLASSES, table)}, source, CLASSES, table)
    for recorded in ({}, {PARTITION_CHECKSUM: None}, {PARTITION_CHECKSUM: "0" * 64}):
        with pytest.raises(FedsimError, match=f"{PARTITION} is not the partition the run trained on") as err:
            check_partition(tmp_path, cfg, recorded, source, CLASSES, table)
        assert PARTITION_CHECKSUM in str(err.value) and source in str(err.value) and "\n" not in str(err.value)


def test_a_partition_of_another_federation_size_is_refused_before_its_checksum(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path))
    with pytest.raises(FedsimError, match="train.num_clients"):
        check_partition(tmp_path, cfg, {}, SUMMARY, CLASSES, counts(cfg.train.num_clients + 1))
