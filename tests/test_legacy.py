"""Record version 1's checksums (fedsim/record/legacy.py), which only ``fedsim record upgrade`` reads: each against
what a fedsim of version 1 wrote (the run results/full-budget/fedavg-1class-seed0 as commit bf05440^ holds it: its
config.yaml, partition.csv and summary.json, copied below) or, for metrics.jsonl's chain, its definition; what each
covers and leaves out; ``check_legacy``'s verdict on a run whose files agree with its record, disagree with it, or
that records only some checksums; ``check_checkpoint``'s on a version-1 checkpoint. The upgrade as a whole:
tests/test_record_upgrade.py."""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from fedsim.digest import digest
from fedsim.errors import FedsimError
from fedsim.record.legacy import (
    check_checkpoint,
    check_legacy,
    config_checksum,
    metrics_checksum,
    partition_checksum,
    summary_checksum,
)

# --- a record fedsim wrote at version 1 (results/full-budget/fedavg-1class-seed0, commit bf05440^) ---------------

V1_CONFIG = """\
name: cifar10-1class-fedavg
seed: 0
engine: local
data:
  dataset:
    name: imagefolder
  root: /work/shared/datasets/cifar10_jpg_q75.tar.gz
  download: false
  augment: true
  normalize: false
  cache_dir: null
partition:
  name: n_class
  classes_per_client: 1
model:
  name: cnn
  norm:
    name: none
strategy:
  name: fedavg
train:
  rounds: 10000
  num_clients: 10
  clients_per_round: null
  local_steps: 10
  local_epochs: null
  batch_size: 32
  lr: 0.01
  momentum: 0.0
  weight_decay: 0.0
  on_client_failure: fail
  round_timeout_s: 3600.0
  max_loss: 1000000.0
eval:
  every: 100
  batch_size: 500
  global_test: true
simulation:
  backend: ray
  client_resources:
    num_cpus: 1.0
    num_gpus: 0.0
  ray_address: null
  device: cpu
  threads: 1
  state_memory_mb: 512.0
  vmap_clients: 1
output:
  dir: runs
  run_dir: /work/main/results/full-budget/fedavg-1class-seed0
  trackers: []
  save_model: true
  progress: false
  checkpoint_every: 50
diagnostics:
  features: true
  isometry: false
  grad_norms: false
  probe_size: 256
  isometry_size: 10
deploy:
  address: 127.0.0.1
  port: 0
  tls: false
  certificates: null
  supernode_auth: false
  startup_timeout_s: 120.0
  private_network: true
"""

_CLASSES = "airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck"
_OWN = {"train": (1, 7, 2, 6, 3, 4, 9, 8, 5, 0), "test": (1, 7, 2, 6, 3, 4, 9, 8, 5, 0)}  # client -> its class
V1_PARTITION = f"split,client,{_CLASSES},total\n" + "".join(
    f"{split},{client},{','.join(str(n if k == own else 0) for k in range(10))},{n}\n"
    for split, n in (("train", 5000), ("test", 1000))
    for client, own in enumerate(_OWN[split])
)

V1_SUMMARY = json.loads("""{"name": "cifar10-1class-fedavg",
 "run_dir": "/work/main/results/full-budget/fedavg-1class-seed0", "rounds": 10000, "wall_time_s": 45194.22,
 "rounds_per_s": 0.221, "steady_s_per_round": 3.3848592738267347, "resumed_from_round": 7650,
 "final_client_mean_acc": 0.5689, "best_client_mean_acc": 0.5715999999999999, "final_global_acc": 0.5689,
 "final_train_loss": 0.12956891477108004,
 "per_class_acc": [0.482, 0.652, 0.42, 0.385, 0.509, 0.471, 0.728, 0.601, 0.87, 0.571],
 "data_sha256": "54cfb8d79e2afbe6ce5d50f3a0dd39912aec1825e0fe0fc308abdd61251638d9",
 "model_sha256": "3145d64d206bbe720bccbfaafd1aea02fd32fb36a81aa6317a824f9d15c0410f", "record_version": 1,
 "config_sha256": "d61f159f6eedc867ee713fb71f2d950cf99825cd0e65b779d614cccfdd71ee46",
 "partition_sha256": "7b289671cfa96085fde4341fbefd7b1f552d85dc49ed8634b54121a8dd28dfa2",
 "metrics_sha256": "be9ac5ddcf6a100ab64c7228d7464cb24fab180cb2fd0779a0fc993db36f899f", "metrics_lines": 99,
 "summary_sha256": "ad52ab17243b0e45190b477b629ae9a761506d4ed5025d5c73ffd8b8da4151ea"}""")


def table(text: str) -> tuple[list[str], dict[str, np.ndarray]]:
    """partition.csv's class names and, per split, its clients x classes counts (the total column left out)."""
    header, *rows = csv.reader(io.StringIO(text))
    counts: dict[str, list[list[int]]] = {}
    for split, _client, *cells in rows:
        counts.setdefault(split, []).append([int(c) for c in cells[:-1]])
    return header[2:-1], {split: np.array(c, dtype=np.int64) for split, c in counts.items()}


def chained(lines: list[dict[str, Any]]) -> str:
    """metrics.jsonl's version-1 checksum by its definition: SHA-256 of "<previous>:<digest of the line>", from ""."""
    sha256 = ""
    for line in lines:
        sha256 = hashlib.sha256((sha256 + ":" + digest(line)).encode()).hexdigest()
    return sha256


def test_the_checksums_are_those_a_version_1_fedsim_wrote() -> None:
    assert config_checksum(yaml.safe_load(V1_CONFIG)) == V1_SUMMARY["config_sha256"]
    assert partition_checksum(*table(V1_PARTITION)) == V1_SUMMARY["partition_sha256"]
    assert summary_checksum(V1_SUMMARY) == V1_SUMMARY["summary_sha256"]


# --- what each checksum covers ------------------------------------------------------------------------------------


def test_metrics_checksum_chains_the_digests_of_the_lines_in_their_order() -> None:
    lines = [{"round": 2, "loss": 1.5, "acc": 0.25}, {"round": 4, "loss": 1.25, "acc": None}, {"round": 6, "acc": 0.5}]
    assert metrics_checksum([]) == ""
    assert metrics_checksum(lines) == chained(lines)
    assert metrics_checksum(lines[:2]) == chained(lines[:2]) != metrics_checksum(lines)
    assert metrics_checksum(lines[::-1]) != metrics_checksum(lines)  # a line moved is a different file
    reordered = [dict(reversed(list(line.items()))) for line in lines]
    assert metrics_checksum(reordered) == metrics_checksum(lines)  # of the values, not of the JSON's key order
    assert metrics_checksum([{**lines[0], "acc": 0.2500001}, *lines[1:]]) != metrics_checksum(lines)


def test_config_checksum_leaves_out_what_a_moved_or_resumed_run_may_change() -> None:
    tree = {"name": "a", "seed": 0, "model": {"name": "mlp", "hidden": [8]}, "train": {"lr": 0.05},
            "output": {"dir": "runs"}, "simulation": {"threads": 1}, "diagnostics": {"features": True},
            "deploy": {"port": 0}}  # fmt: skip
    assert config_checksum(tree) == digest({"seed": 0, "model.name": "mlp", "model.hidden": [8], "train.lr": 0.05})
    v1 = yaml.safe_load(V1_CONFIG)
    moved = copy.deepcopy(v1)
    moved["name"] = "renamed"
    moved["output"]["run_dir"] = "/elsewhere/run"
    moved["simulation"]["backend"] = "inline"
    moved["diagnostics"]["features"] = False
    moved["deploy"]["port"] = 9092
    assert config_checksum(moved) == V1_SUMMARY["config_sha256"]
    assert config_checksum(dict(reversed(list(v1.items())))) == V1_SUMMARY["config_sha256"]  # key order: no matter
    learns = copy.deepcopy(v1)
    learns["train"]["lr"] = 0.02
    assert config_checksum(learns) != V1_SUMMARY["config_sha256"]
    added = copy.deepcopy(v1)
    added["train"]["label_smoothing"] = 0.0  # a key a later fedsim added: the run's own file did not have it
    assert config_checksum(added) != V1_SUMMARY["config_sha256"]


def test_partition_checksum_is_of_the_counts_whatever_their_integer_type() -> None:
    classes, counts = table(V1_PARTITION)
    expected = V1_SUMMARY["partition_sha256"]
    assert partition_checksum(tuple(classes), {s: c.astype(np.int32) for s, c in counts.items()}) == expected
    assert partition_checksum(classes, dict(reversed(list(counts.items())))) == expected
    moved = {s: c.copy() for s, c in counts.items()}
    moved["test"][0, [0, 1]] = [1, 999]  # one test image of client 0 counted as another class
    assert partition_checksum(classes, moved) != expected
    assert partition_checksum([*classes[1:], classes[0]], counts) != expected


def test_summary_checksum_is_of_its_other_fields_as_json_holds_them() -> None:
    fields = {k: v for k, v in V1_SUMMARY.items() if k != "summary_sha256"}
    assert summary_checksum(fields) == summary_checksum({**fields, "summary_sha256": "0" * 64}) == digest(fields)
    as_written = {**fields, "per_class_acc": tuple(fields["per_class_acc"]), 3: "x"}  # JSON: a list, a string key
    assert summary_checksum(as_written) == digest({**fields, "3": "x"})
    assert summary_checksum({**fields, "rounds": 10000.0}) != summary_checksum(fields)  # 1e4 is not 10000
    assert summary_checksum({**fields, "wall_time_s": 45194.23}) != summary_checksum(fields)


# --- check_legacy -------------------------------------------------------------------------------------------------

LINES = [{"round": 100, "loss": 2.25, "acc": 0.125}, {"round": 200, "loss": 2.0, "acc": 0.25},
         {"round": 300, "loss": 1.75, "acc": 0.375}]  # fmt: skip
MODEL = {"conv.weight": torch.arange(12, dtype=torch.float32).view(3, 4), "fc.bias": torch.zeros(2)}


def run_dir(tmp_path: Path, config: str = V1_CONFIG) -> Path:
    path = tmp_path / "run"
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(config)
    return path


def summary(**changed: Any) -> dict[str, Any]:
    """V1_SUMMARY for LINES and MODEL, with ``changed`` fields, and its own checksum of them."""
    record = {**V1_SUMMARY, "metrics_sha256": chained(LINES), "metrics_lines": len(LINES),
              "model_sha256": digest(MODEL), **changed}  # fmt: skip
    return {**record, "summary_sha256": summary_checksum(record)}


def test_a_summary_whose_files_agree_covers_every_line(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    assert check_legacy(path, "summary.json", summary(), LINES, table(V1_PARTITION), MODEL) == LINES
    moved = yaml.safe_load(V1_CONFIG)
    moved["output"]["run_dir"] = str(tmp_path / "run")  # the directory moved: its config.yaml says so
    path = run_dir(tmp_path / "moved", yaml.safe_dump(moved))
    assert check_legacy(path, "summary.json", summary(), LINES, table(V1_PARTITION), MODEL) == LINES


def _edited_config() -> str:
    return V1_CONFIG.replace("  lr: 0.01\n", "  lr: 0.02\n")


def _flipped_model() -> dict[str, torch.Tensor]:
    model = {k: v.clone() for k, v in MODEL.items()}
    model["conv.weight"].view(torch.int32)[1, 2] ^= 1  # the lowest bit of one weight
    return model


@pytest.mark.parametrize(
    ("edit", "key", "file"),
    [
        ({"record": {"final_global_acc": 0.99}}, "summary_sha256", "summary.json"),
        ({"config": _edited_config()}, "config_sha256", "config.yaml"),
        ({"metrics": [LINES[0], {**LINES[1], "acc": 0.5}, LINES[2]]}, "metrics_sha256", "metrics.jsonl"),
        ({"metrics": [LINES[0], LINES[2]]}, "metrics_sha256", "metrics.jsonl"),  # a line lost
        ({"metrics": LINES[:2]}, "metrics_sha256", "metrics.jsonl"),  # the last line lost
        ({"metrics": [*LINES, {"round": 400, "loss": 1.5}]}, "metrics_lines", "metrics.jsonl"),  # one past the end
        ({"partition": V1_PARTITION.replace("test,9,1000,0", "test,9,999,1")}, "partition_sha256", "partition.csv"),
        ({"model": _flipped_model()}, "model_sha256", "model.pt"),
    ],
    ids=["summary-field", "config", "metrics-value", "metrics-line-lost", "metrics-last-lost", "metrics-line-added",
         "partition", "model-bit"],  # fmt: skip
)
def test_a_file_that_disagrees_with_the_summary_is_named_with_its_checksum(
    tmp_path: Path, edit: dict[str, Any], key: str, file: str
) -> None:
    record = summary()
    if "record" in edit:
        record.update(edit["record"])  # edited after its checksum was written
    path = run_dir(tmp_path, edit.get("config", V1_CONFIG))
    partition = table(edit.get("partition", V1_PARTITION))
    with pytest.raises(FedsimError) as err:
        check_legacy(path, "summary.json", record, edit.get("metrics", LINES), partition, edit.get("model", MODEL))
    message = str(err.value)
    assert message.startswith(f"{path}: {file} ") and re.search(rf"\b{key}\b in summary\.json\b", message), message


def test_a_progress_covers_its_count_of_lines_or_else_those_up_to_its_round(tmp_path: Path) -> None:
    """A stopped run wrote at most one line past its progress.json (the round after it)."""
    path = run_dir(tmp_path)
    counted = {"round": 200, "config_sha256": V1_SUMMARY["config_sha256"], "metrics_sha256": chained(LINES[:2]),
               "metrics_lines": 2, "summary_sha256": "unchecked: only a summary has one"}  # fmt: skip
    assert check_legacy(path, "progress.json", counted, LINES, None, None) == LINES[:2]
    with pytest.raises(FedsimError, match=rf"^{re.escape(str(path))}: metrics\.jsonl\b.*\bmetrics_sha256 in progress"):
        check_legacy(path, "progress.json", {**counted, "metrics_lines": 3}, LINES, None, None)
    assert check_legacy(path, "progress.json", {"round": 200}, LINES, None, None) == LINES[:2]
    assert check_legacy(path, "progress.json", {"round": 50}, LINES, None, None) == []
    assert check_legacy(path, "summary.json", {"rounds": 200}, LINES, None, None) == LINES  # a summary: every line


@pytest.mark.parametrize(
    ("record", "key"),
    [({"loss": 1.0}, "round"), ({"round": "2"}, "round"), ({"round": True}, "round"), ({"round": -1}, "round"),
     ({"round": 2, "metrics_lines": "2"}, "metrics_lines"), ({"round": 2, "metrics_lines": 1.0}, "metrics_lines")],
    ids=["no-round", "round-text", "round-bool", "round-negative", "lines-text", "lines-float"],
)  # fmt: skip
def test_an_older_progress_with_a_count_missing_or_not_a_count_is_named(
    tmp_path: Path, record: dict[str, Any], key: str
) -> None:
    """A KeyError or TypeError (a traceback from fedsim record upgrade) before: now the file and the field."""
    path = run_dir(tmp_path)
    with pytest.raises(FedsimError) as err:
        check_legacy(path, "progress.json", record, LINES, None, None)
    message = str(err.value)
    assert message.startswith(f"{path}: progress.json has {key} = {record.get(key)!r} "), message


def test_an_older_progress_counting_lines_without_their_checksum_is_a_metrics_mismatch(tmp_path: Path) -> None:
    with pytest.raises(FedsimError, match=r"\bmetrics_sha256 in progress\.json\b"):
        check_legacy(run_dir(tmp_path), "progress.json", {"round": 200, "metrics_lines": 2}, LINES, None, None)


def test_only_the_checksums_a_record_has_are_checked(tmp_path: Path) -> None:
    """A record of a fedsim before record versions has some or none of them; a file the run lacks is not checked."""
    path = run_dir(tmp_path, _edited_config())
    bare = {k: v for k, v in V1_SUMMARY.items() if not k.endswith("_sha256") and k != "metrics_lines"}
    flipped, cut = _flipped_model(), table(V1_PARTITION.replace("test,9,1000,0", "test,9,999,1"))
    assert check_legacy(path, "summary.json", bare, LINES, cut, flipped) == LINES
    partial = {**bare, "partition_sha256": V1_SUMMARY["partition_sha256"], "model_sha256": digest(MODEL)}
    assert check_legacy(path, "summary.json", partial, LINES, None, None) == LINES  # no partition.csv, no model.pt
    with pytest.raises(FedsimError, match=r"\bpartition_sha256\b"):
        check_legacy(path, "summary.json", partial, LINES, cut, None)


# --- check_checkpoint ---------------------------------------------------------------------------------------------


def payload(**fields: Any) -> dict[str, Any]:
    """A version-1 checkpoint's fields with the digest of them it held under ``sha256``."""
    base = {"round": 50, "model": {k: v.clone() for k, v in MODEL.items()}, "server_state": {},
            "client_state": {"3": torch.tensor([7, 0, 255], dtype=torch.uint8)}, "data_sha256": "ab" * 32,
            "rng": {"torch": torch.tensor([1, 2], dtype=torch.uint8)}, "config": "{}"}  # as a version-1 one held them
    base.update(fields)
    return {**base, "sha256": digest(base)}


def test_a_checkpoint_whose_digest_agrees_is_its_fields_without_it(tmp_path: Path) -> None:
    file = tmp_path / "checkpoint.pt"
    full = payload()
    fields = check_checkpoint(file, full)
    assert set(fields) == set(full) - {"sha256"}
    assert digest(fields) == full["sha256"] and fields["client_state"] is full["client_state"]


def test_a_checkpoint_that_changed_after_it_was_written_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "checkpoint.pt"
    changed = payload()
    changed["model"]["fc.bias"][1] = 1e-30
    with pytest.raises(FedsimError, match=rf"^{re.escape(str(file))}: "):
        check_checkpoint(file, changed)
    with pytest.raises(FedsimError, match=rf"^{re.escape(str(file))}: "):
        check_checkpoint(file, {k: v for k, v in payload().items() if k != "sha256"})  # no digest at all


@pytest.mark.parametrize(
    ("fields", "missing"),
    [({"client_state": None}, "client_state"), ({"data_sha256": None}, "data_sha256"),
     ({"client_state": None, "data_sha256": None}, "client_state")],
    ids=["no-client-state", "no-data-fingerprint", "neither"],
)  # fmt: skip
def test_a_checkpoint_without_what_a_resume_checks_cannot_be_upgraded(
    tmp_path: Path, fields: dict[str, Any], missing: str
) -> None:
    file = tmp_path / "checkpoint.pt"
    with pytest.raises(FedsimError, match=rf"^{re.escape(str(file))}: .*\b{missing}\b"):
        check_checkpoint(file, payload(**fields))
    absent = {k: v for k, v in payload().items() if k not in (missing, "sha256")}
    with pytest.raises(FedsimError, match=rf"\b{missing}\b"):  # left out altogether, as an older fedsim did
        check_checkpoint(file, {**absent, "sha256": digest(absent)})
