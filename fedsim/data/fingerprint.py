"""The fingerprint of the data a run trains on, recorded in its run directory (``checkpoint.pt``,
``summary.json``) so that ``fedsim run --resume`` and ``fedsim local`` never go on with other data.

A SHA-256 of the decoded dataset (both splits' images and labels, the class names, the domains), not
of the files it came from: the same for the same data however it is stored or named (an npz, an
archive, torchvision's files, a plugin's loader), another for a relabelled copy. It costs 0.15 s for
CIFAR-10's 184 MB of images, once per run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedsim.data.base import ArrayDataset
from fedsim.errors import DataError
from fedsim.integrity import digest
from fedsim.paths import package_path

DATA_FINGERPRINT = "data_sha256"  # its key in checkpoint.pt and summary.json


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
        raise DataError(
            f"data.root {package_path(root)} holds other data than the run trained on ({DATA_FINGERPRINT} "
            f"{now[:16]}..., {where} recorded {recorded[:16]}...): refused; give the run the data it began with"
        )
