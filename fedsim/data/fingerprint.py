"""The fingerprint of the data a run trains on, recorded in its run directory (``checkpoint.pt``,
``summary.json``) so that ``fedsim run --resume`` and ``fedsim local`` never go on with other data, and
reported by every client node before round 1 so that no node trains on other data than the server's
(a deployed SuperNode reads ``data.root`` on its own host).

A SHA-256 of the decoded dataset (both splits' images and labels, the class names, the domains), not
of the files it came from: the same for the same data however it is stored or named (an npz, an
archive, torchvision's files, a plugin's loader), another for a relabelled copy. It costs 0.15 s for
CIFAR-10's 184 MB of images, once per run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedsim.data.base import ArrayDataset
from fedsim.digest import digest
from fedsim.errors import DataError
from fedsim.paths import package_path
from fedsim.record.manifest import DATA_FINGERPRINT


def fingerprint(dataset: ArrayDataset) -> str:
    """SHA-256 (hex) of every field of ``dataset`` but its name."""
    return digest({f.name: getattr(dataset, f.name) for f in dataclasses.fields(dataset) if f.name != "name"})


def check_same_data(recorded: object, now: str, where: Path, root: str) -> None:
    """Refuse to go on with the run whose ``where`` (its checkpoint or summary) recorded ``recorded`` when the
    data at ``root`` (``data.root``) has the fingerprint ``now``."""
    if not isinstance(recorded, str):
        raise DataError(
            f"{where}: records no fingerprint ({DATA_FINGERPRINT}) of the data the run trained on (written by a "
            "fedsim before data fingerprints), so it cannot show that data.root holds the same data: refused"
        )
    if recorded != now:
        raise _other_data(
            f"data.root {package_path(root)}", "the run trained on", now, f"{where} recorded", recorded,
            remedy="give the run the data it began with",
        )  # fmt: skip


def check_node_data(node: int, partition: int, node_sha256: str, server_sha256: str, root: str) -> None:
    """Refuse a run one of whose client nodes (``node``, holding ``partition``) would train on data of the
    fingerprint ``node_sha256`` at its ``root`` (``data.root``) when the server's has ``server_sha256``: one
    run, one dataset, whatever a node's host holds at that path."""
    if node_sha256 != server_sha256:
        where = f"node {node} (partition {partition}): data.root {package_path(root)}"
        raise _other_data(
            where, "the server's", node_sha256, "the server's", server_sha256,
            remedy="give every node the data the server reads (a SuperNode trains on what its host holds there)",
        )  # fmt: skip


def _other_data(where: str, than: str, now: str, whose: str, theirs: str, *, remedy: str) -> DataError:
    """The one wording of other data: ``where`` has the fingerprint ``now``, ``whose`` says ``theirs``."""
    return DataError(
        f"{where} holds other data than {than} ({DATA_FINGERPRINT} {now[:16]}..., {whose} {theirs[:16]}...): "
        f"refused; {remedy}"
    )
