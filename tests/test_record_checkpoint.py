"""checkpoint.pt's format (fedsim.record.checkpoint): its fields read back as written, its payload held to the
size and SHA-256 beside it; a file whose outer fields are not what fedsim writes is one line naming it, never
a traceback."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from fedsim.arrays import array_view, to_array_record
from fedsim.config_file import parse_config
from fedsim.errors import FedsimError
from fedsim.record.checkpoint import PAYLOAD, Checkpoint
from fedsim.record.layout import CHECKPOINT, RECORD_VERSION
from fedsim.record.manifest import SHA256, SIZE, entry_of
from tests.conftest import small_config


def saved(tmp_path: Path) -> Checkpoint:
    cfg = parse_config(small_config(tmp_path))
    checkpoint = Checkpoint(
        round=4, arrays=to_array_record({"w": torch.arange(6.0)}), server_state=ArrayRecord(),
        metrics=[{"round": 2, "client_mean_acc": 0.5}], elapsed_s=1.5, run_key="r-1", client_state={1: "ab" * 32},
        config=cfg.to_json(), data_sha256="cd" * 32, rng={"torch": torch.get_rng_state()}, failed={3: [1]},
    )  # fmt: skip
    checkpoint.save(tmp_path)
    return checkpoint


def outer(tmp_path: Path) -> dict[str, object]:
    return torch.load(tmp_path / CHECKPOINT, weights_only=True)


def test_a_checkpoint_reads_back_as_written_with_its_payloads_entry(tmp_path: Path) -> None:
    written = saved(tmp_path)
    back = Checkpoint.load(tmp_path, parse_config(small_config(tmp_path)))
    assert (back.round, back.metrics, back.client_state, back.failed) == (4, written.metrics, {1: "ab" * 32}, {3: [1]})
    assert np.array_equal(array_view(back.arrays["w"]), np.arange(6, dtype=np.float32))
    fields = outer(tmp_path)
    assert fields["record_version"] == RECORD_VERSION
    assert {SIZE: fields[SIZE], SHA256: fields[SHA256]} == entry_of(fields[PAYLOAD].numpy().tobytes())


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({SIZE: "123"}, "no size and sha256 of its payload"),
        ({SIZE: 12.0}, "no size and sha256 of its payload"),
        ({SIZE: None}, "no size and sha256 of its payload"),
        ({SHA256: None}, "no size and sha256 of its payload"),
        ({"record_version": "2"}, "record_version '2' is not a record version fedsim writes"),
        ({"record_version": [2]}, "record_version [2] is not a record version fedsim writes"),
        ({"record_version": None}, "a run record of version 0, older than this fedsim's"),
        ({PAYLOAD: torch.zeros(3, dtype=torch.int8)}, "no payload of bytes"),
        ({SIZE: 10**9}, "bytes where the run wrote 1,000,000,000"),
        ({SHA256: "0" * 64}, "not the file the run wrote (its sha256 in checkpoint.pt differs"),
    ],
)
def test_a_checkpoint_whose_outer_fields_are_not_fedsims_is_one_line(
    tmp_path: Path, change: dict[str, object], said: str
) -> None:
    saved(tmp_path)
    fields = {**outer(tmp_path), **change}
    buffer = io.BytesIO()
    torch.save({k: v for k, v in fields.items() if v is not None}, buffer)
    (tmp_path / CHECKPOINT).write_bytes(buffer.getvalue())
    with pytest.raises(FedsimError) as err:
        Checkpoint.load(tmp_path)
    assert str(tmp_path / CHECKPOINT) in str(err.value) and said in str(err.value) and "\n" not in str(err.value)
