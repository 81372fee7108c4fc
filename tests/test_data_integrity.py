"""Data a run trusts: archives read to their end and checked (a damaged member or header is an error naming
where, never a dataset that ends early), decode caches keyed by the source's bytes and written only after a
whole, checked read, and the fingerprint of the data a run trained on, which ``--resume`` checks."""

from __future__ import annotations

import copy
import errno
import gzip
import io
import json
import os
import re
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from flwr.app import Context, Message

from fedsim import wire
from fedsim.app.cli import main
from fedsim.client import app as client_app
from fedsim.client.app import app as fedsim_client
from fedsim.data import load_dataset
from fedsim.data.fingerprint import fingerprint
from fedsim.engines.local import LocalGrid
from fedsim.errors import DataError
from fedsim.experiment import federation
from fedsim.record.checkpoint import PAYLOAD, checkpoint_bytes
from fedsim.record.layout import CHECKPOINT
from fedsim.record.manifest import DATA_FINGERPRINT
from tests.conftest import MNIST_SMALL, small_config, write_config
from tests.data_fixtures import relabelled, tree_files, write_tar
from tests.fault_lines import assert_said

# ----------------------------------------------------------------- archives


def plain_tar(tmp_path: Path, files: dict[str, bytes] | None = None) -> bytes:
    """tree_files() as tar bytes: members train/{dog,bird,cat}/0{0,1,2}.png, test/{dog,bird,cat}/0{0,1}.png,
    README.txt, in that order."""
    return write_tar(tmp_path / "plain.tar", files or tree_files(), "w").read_bytes()


def refused(archive: Path, cache: Path) -> str:
    """The error loading ``archive`` gives, after checking that it left nothing in the cache."""
    with pytest.raises(DataError) as err:
        load_dataset("imagefolder", archive, cache_dir=cache)
    assert not cache.exists() or not list(cache.iterdir())  # neither a cache nor a temp file
    return str(err.value)


def test_a_damaged_tar_header_is_an_error_naming_where_never_an_early_end(tmp_path: Path) -> None:
    """tarfile takes a header that fails its checksum for the end of the archive: the CIFAR-10 archive with
    one such header loaded without its last two test classes, and cached them."""
    raw = bytearray(plain_tar(tmp_path))
    header = raw.index(b"test/cat/00.png")
    raw[header + 110] ^= 0x01  # a digit of the uid: still a number, but the header's checksum no longer holds
    archive = tmp_path / "tiny.tar.gz"
    archive.write_bytes(gzip.compress(bytes(raw), mtime=0))
    assert refused(archive, tmp_path / "cache") == (
        f"dataset archive {archive}: after member 'test/bird/01.png', the next header (naming 'test/cat/00.png') "
        "is damaged: bad checksum; get the archive again"
    )


def test_a_tar_cut_short_between_members_is_an_error(tmp_path: Path) -> None:
    raw = plain_tar(tmp_path)
    archive = tmp_path / "cut.tar"
    archive.write_bytes(raw[: raw.index(b"test/cat/00.png")])  # no end-of-archive marker
    assert refused(archive, tmp_path / "cache") == (
        f"dataset archive {archive}: after member 'test/bird/01.png', it ends without tar's end-of-archive "
        "marker: cut short; get the archive again"
    )


def test_a_gzip_whose_checksum_fails_is_an_error(tmp_path: Path) -> None:
    """tarfile's stream reader never checks gzip's CRC-32: data that changed inside it loaded."""
    compressed = bytearray(gzip.compress(plain_tar(tmp_path), mtime=0))
    compressed[-8] ^= 0x01  # the CRC-32 of the uncompressed data
    archive = tmp_path / "crc.tar.gz"
    archive.write_bytes(compressed)
    assert "CRC check failed" in refused(archive, tmp_path / "cache")


def test_a_damaged_byte_anywhere_in_a_gzip_never_loads(tmp_path: Path) -> None:
    """One flipped byte in the compressed stream: a zlib error, a header or image that fails its check, or
    gzip's CRC at the end; before, some of these loaded as a smaller dataset or said "no test images"."""
    compressed = gzip.compress(plain_tar(tmp_path), mtime=0)
    for at in range(20, len(compressed) - 8, len(compressed) // 12):
        damaged = bytearray(compressed)
        damaged[at] ^= 0x10
        archive = tmp_path / f"flip{at}.tar.gz"
        archive.write_bytes(damaged)
        message = refused(archive, tmp_path / "cache")
        assert str(archive) in message and "no test images" not in message


def test_a_damaged_zip_member_is_an_error_naming_it(tmp_path: Path) -> None:
    archive = tmp_path / "tiny.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for name, data in tree_files().items():
            z.writestr(name, data)
    raw = bytearray(archive.read_bytes())
    raw[raw.index(b"test/cat/00.png") + len("test/cat/00.png") + 40] ^= 0xFF  # inside the member's PNG bytes
    archive.write_bytes(raw)
    assert refused(archive, tmp_path / "cache").startswith(
        f"dataset archive {archive}: member 'test/cat/00.png' is damaged (Bad CRC-32 for file 'test/cat/00.png')"
    )


def test_a_zip_whose_directory_lost_a_member_is_an_error(tmp_path: Path) -> None:
    """The end record's directory offset moved past its first entry (and its size cut by as much), so that
    zipfile reads one member fewer without a word; the record's member count still says how many there are."""
    archive = tmp_path / "tiny.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name, data in tree_files().items():
            z.writestr(name, data)
    raw = bytearray(archive.read_bytes())
    end = raw.rindex(b"PK\x05\x06")
    _, _, _, _, total, size, offset, _ = struct.unpack_from("<4s4H2LH", raw, end)
    entry = raw.index(b"PK\x01\x02", offset + 1) - offset  # the first directory entry's length
    struct.pack_into("<2L", raw, end + 12, size - entry, offset + entry)
    archive.write_bytes(raw)
    assert len(zipfile.ZipFile(archive).infolist()) == total - 1
    assert refused(archive, tmp_path / "cache") == (
        f"dataset archive {archive}: its directory lists {total - 1} members but its end record promises {total}: "
        "the archive is corrupt, get it again"
    )


def test_the_cache_is_keyed_by_the_sources_bytes(tmp_path: Path) -> None:
    """Another archive of the same size and mtime (cats and dogs swapped) is decoded, not read from the cache."""
    files = tree_files()
    archive = write_tar(tmp_path / "tiny.tar", files, "w")
    first = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    stat = archive.stat()
    swapped = {name.replace("/cat/", "/tmp/").replace("/dog/", "/cat/").replace("/tmp/", "/dog/"): data
               for name, data in files.items()}  # fmt: skip
    write_tar(archive, swapped, "w")
    os.utime(archive, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert archive.stat().st_size == stat.st_size
    second = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    cat, dog = first.classes.index("cat"), first.classes.index("dog")
    assert torch.equal(second.x_train[second.y_train == cat], first.x_train[first.y_train == dog])
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2


def test_a_damaged_archive_stops_a_run_before_it_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = bytearray(plain_tar(tmp_path))
    raw[raw.index(b"test/cat/00.png") + 110] ^= 0x01
    archive = tmp_path / "tiny.tar"
    archive.write_bytes(raw)
    data = {"dataset": "imagefolder", "root": str(archive), "cache_dir": str(tmp_path / "cache"), "augment": False}
    raw_cfg = small_config(tmp_path, data=data, train={"rounds": 1, "batch_size": 2})
    raw_cfg["output"]["run_dir"] = str(tmp_path / "r")
    assert main(["run", str(write_config(tmp_path, raw_cfg))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fedsim: error: dataset archive {archive}: after member")
    assert not (tmp_path / "r").exists() and not (tmp_path / "cache").exists()


# ----------------------------------------------------------------- the run's data fingerprint


def test_resume_refuses_other_data_than_the_run_trained_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "mnist.npz"
    shutil.copy(MNIST_SMALL, data)
    raw = small_config(tmp_path, data={"root": str(data)}, train={"rounds": 1, "local_steps": 1})
    raw["output"].update(run_dir=str(tmp_path / "r"), checkpoint_every=1)
    assert main(["run", str(write_config(tmp_path, raw))]) == 0
    run_dir = tmp_path / "r"
    summary = (run_dir / "summary.json").read_text()
    recorded = fingerprint(load_dataset("npz", data))
    assert f'"{DATA_FINGERPRINT}": "{recorded}"' in summary
    (run_dir / "summary.json").unlink()  # as if killed after its last checkpoint

    relabelled(MNIST_SMALL, data)
    now = fingerprint(load_dataset("npz", data))
    monkeypatch.setattr(federation, "_CACHE", {})

    def resume() -> int:
        federation._CACHE.clear()  # as in the new process a resume is: the data read anew
        return main(["run", "--resume", str(run_dir)])

    assert resume() == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1, said
    fields = {"data": re.escape(str(data)), "recorded_in": re.escape(str(run_dir / CHECKPOINT))}
    assert_said("other data", said[:-1], now=now[:16], recorded=recorded[:16], **fields)

    shutil.copy(MNIST_SMALL, data)
    saved = (run_dir / CHECKPOINT).read_bytes()
    outer = torch.load(io.BytesIO(saved), weights_only=True)
    payload = torch.load(io.BytesIO(outer[PAYLOAD].numpy().tobytes()), weights_only=True)
    del payload[DATA_FINGERPRINT]  # a checkpoint without one, its checksums made anew: not a checkpoint fedsim reads
    (run_dir / CHECKPOINT).write_bytes(checkpoint_bytes(payload))
    assert resume() == 2
    assert (
        f"{run_dir / CHECKPOINT}: not a readable fedsim checkpoint (KeyError: '{DATA_FINGERPRINT}')"
        in capsys.readouterr().err
    )

    (run_dir / CHECKPOINT).write_bytes(saved)
    assert resume() == 0  # the data it began with


def node_reading(partition: int, root: Path) -> Callable[[Message, Context], Message]:
    """fedsim's ClientApp, but the node holding ``partition`` reads the run's data from ``root``: as a SuperNode
    whose host holds another copy of the data where the run's data.root points."""

    def serve(msg: Message, context: Context) -> Message:
        config = msg.content.config_records.get(wire.CONFIG)
        if wire.node_partition(context) == partition and config is not None and wire.RUN_CONFIG in config:
            msg = copy.deepcopy(msg)  # the server's record is not the node's to change
            run = json.loads(wire.run_config_json(msg))
            run["data"]["root"] = str(root)
            msg.content.config_records[wire.CONFIG][wire.RUN_CONFIG] = json.dumps(run)
        return fedsim_client(msg, context)

    return serve


def test_a_node_with_other_data_is_refused_before_round_one_whatever_the_failure_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every node answers the server's partition query with the fingerprint of the data it read (a deployed
    SuperNode reads data.root on its own host): a node with a relabelled copy is no node failure to skip."""
    other = tmp_path / "relabelled.npz"
    relabelled(MNIST_SMALL, other)
    monkeypatch.setattr(client_app, "app", node_reading(1, other))  # the engine's nodes run this ClientApp
    # as a grid of nodes elsewhere (a deployment's), whose every node is asked: the inline grid's share its process
    monkeypatch.setattr(LocalGrid, "known_partitions", lambda self: None)
    train = {"rounds": 1, "num_clients": 2, "local_steps": 1, "on_client_failure": "skip"}
    raw = small_config(tmp_path, train=train, eval={"every": 1})
    raw["output"]["run_dir"] = str(tmp_path / "r")
    assert main(["run", str(write_config(tmp_path, raw))]) == 2
    server, node = (fingerprint(load_dataset("npz", path)) for path in (MNIST_SMALL, other))
    assert server != node
    said = capsys.readouterr().err
    assert said.count("\n") == 1, said
    data = re.escape(str(MNIST_SMALL))
    assert_said("a node's other data", said[:-1], node=2, partition=1, data=data, theirs=node[:16], ours=server[:16])
    assert not (tmp_path / "r").exists()  # nothing recorded (no metrics.jsonl, no summary.json): nothing left


# ----------------------------------------------------------------- temporary files


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_leaves_no_temp_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fsync = os.fsync

    def disk_full_for_checkpoints(fd: int) -> None:
        if f".{CHECKPOINT}." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", disk_full_for_checkpoints)
    raw = small_config(tmp_path, train={"rounds": 1, "local_steps": 1})
    raw["output"].update(run_dir=str(tmp_path / "r"), checkpoint_every=1)
    assert main(["run", str(write_config(tmp_path, raw))]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1, said
    path = re.escape(str(tmp_path / "r" / CHECKPOINT))
    assert_said("cannot write", said[:-1], path=path, why=os.strerror(errno.ENOSPC))
    assert not list((tmp_path / "r").glob(".*.tmp")) and not (tmp_path / "r" / CHECKPOINT).exists()
