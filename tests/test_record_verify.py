"""The run record's verifier (fedsim.record.verify) and its one integrity scheme (fedsim.record.manifest): every
file of the layout's manifest, changed, cut short, lost or added after the run, is refused with FedsimError in
one line naming the file, never another exception; only a model left out of a kept record is read, with a
warning. The checks iterate the layout table, so a file added to the manifest is checked here without a new
test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.config_file import parse_config
from fedsim.errors import FedsimError
from fedsim.record.layout import LEFT_OUT, MANIFEST, METRICS, PROGRESS, SUMMARY
from fedsim.record.manifest import FILES, GrowingEntry, entry_of
from fedsim.record.reader import metrics_bytes
from fedsim.record.verify import LeftOut, check_files, check_partition
from fedsim.record.writer import RunDir
from tests.conftest import small_config

CLASSES = ["0", "1", "2"]


def counts(clients: int) -> dict[str, np.ndarray]:
    return {split: np.arange(clients * len(CLASSES)).reshape(clients, len(CLASSES)) for split in ("train", "test")}


def written_run(tmp_path: Path) -> tuple[Path, dict[str, object], dict[str, object]]:
    """A run directory as RunDir writes it, of every file of the manifest: its progress after round 2 and its
    summary after round 3."""
    cfg = parse_config(small_config(tmp_path))
    out = RunDir(tmp_path / "run")
    out.write_config(cfg)
    table = counts(cfg.train.num_clients)
    out.write_partition(table["train"], table["test"], CLASSES)
    out.append_metrics({"round": 2, "client_mean_acc": 0.5})
    out.write_progress(2, 1.0, 0.5)
    progress = json.loads((out.path / PROGRESS).read_text())
    out.append_metrics({"round": 3, "client_mean_acc": 0.25})
    out.save_model({"w": torch.arange(4.0)})
    summary = out.write_summary({"rounds": 3})
    assert set(summary[FILES]) == set(MANIFEST)  # every file of the layout's manifest is listed
    return out.path, progress, summary


def test_the_files_a_run_wrote_pass_and_an_entry_is_size_and_sha256_of_the_bytes(tmp_path: Path) -> None:
    path, progress, summary = written_run(tmp_path)
    check_files(path, summary, SUMMARY, metrics_bytes(path))
    check_files(path, progress, PROGRESS, metrics_bytes(path))  # its line of round 3 is the one past round 2
    for name in MANIFEST:
        assert summary[FILES][name] == entry_of((path / name).read_bytes())
    first = (path / METRICS).read_bytes().splitlines(keepends=True)[0]
    assert progress[FILES][METRICS] == entry_of(first) == {"size": len(first), "sha256": entry_of(first)["sha256"]}
    grown = GrowingEntry(b"ab")
    grown.add(b"cd")
    assert grown.entry() == entry_of(b"abcd")


@pytest.mark.parametrize("name", MANIFEST)
@pytest.mark.parametrize("change", ["edited", "cut short", "grown", "lost"])
def test_a_file_of_the_manifest_changed_after_the_run_is_refused_naming_it(
    tmp_path: Path, name: str, change: str
) -> None:
    path, _, summary = written_run(tmp_path)
    file = path / name
    data = file.read_bytes()
    if change == "edited":  # one byte, the size kept
        file.write_bytes(data[:-2] + bytes([data[-2] ^ 1]) + data[-1:])
    elif change == "cut short":
        file.write_bytes(data[:-1])
    elif change == "grown":
        file.write_bytes(data + data[-1:])
    else:
        file.unlink()
        if name in LEFT_OUT:  # a record kept without its model: read, with a warning naming it
            with pytest.warns(LeftOut, match=rf"^{re.escape(str(file))}: not in the run directory"):
                check_files(path, summary, SUMMARY, metrics_bytes(path))
            return
    with pytest.raises(FedsimError) as err:
        check_files(path, summary, SUMMARY, metrics_bytes(path))
    message = str(err.value)
    assert str(file) in message and "\n" not in message
    said = "sha256" if change == "edited" else "missing" if change == "lost" and name != METRICS else "size"
    assert said in message


@pytest.mark.parametrize("name", MANIFEST)
def test_a_file_the_record_does_not_list_is_refused(tmp_path: Path, name: str) -> None:
    path, _, summary = written_run(tmp_path)
    unlisted = {**summary, FILES: {k: v for k, v in summary[FILES].items() if k != name}}
    with pytest.raises(FedsimError, match=f"{name}: .*summary.json\\b.*{name}"):
        check_files(path, unlisted, SUMMARY, metrics_bytes(path))


def test_past_progress_json_only_the_line_of_the_round_after_is_accepted(tmp_path: Path) -> None:
    path, progress, _ = written_run(tmp_path)
    check_files(path, progress, PROGRESS, metrics_bytes(path))
    with pytest.raises(FedsimError, match=r"metrics\.jsonl: .*progress\.json"):  # round 3 after round 1's
        check_files(path, {**progress, "round": 1}, PROGRESS, metrics_bytes(path))
    with (path / METRICS).open("a") as f:
        f.write(json.dumps({"round": 4, "client_mean_acc": 0.5}) + "\n")
    with pytest.raises(FedsimError, match=r"metrics\.jsonl: .*progress\.json"):  # two lines past it
        check_files(path, progress, PROGRESS, metrics_bytes(path))


@pytest.mark.parametrize("tail", [b"\n", b"  \n", b"\r\n", b"[3]\n", b"null\n"])
def test_a_line_past_progress_json_that_is_no_round_is_one_line(tmp_path: Path, tail: bytes) -> None:
    path, progress, _ = written_run(tmp_path)
    (path / "metrics.jsonl").write_bytes(b"".join((path / "metrics.jsonl").read_bytes().splitlines(True)[:1]) + tail)
    with pytest.raises(FedsimError, match=r"metrics\.jsonl: .*progress\.json") as err:
        check_files(path, progress, PROGRESS, metrics_bytes(path))
    assert "\n" not in str(err.value)


def test_a_partition_of_another_federation_size_is_refused(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path))
    check_partition(tmp_path, cfg, counts(cfg.train.num_clients))
    with pytest.raises(FedsimError, match="train.num_clients"):
        check_partition(tmp_path, cfg, counts(cfg.train.num_clients + 1))


@pytest.mark.parametrize("name", LEFT_OUT)
def test_a_link_whose_target_is_gone_is_no_file_left_out(tmp_path: Path, name: str) -> None:
    path, _, summary = written_run(tmp_path)
    (path / name).unlink()
    (path / name).symlink_to(tmp_path / "gone")
    with pytest.raises(FedsimError, match=rf"^{re.escape(str(path / name))}: missing, where summary.json lists"):
        check_files(path, summary, SUMMARY, metrics_bytes(path))
