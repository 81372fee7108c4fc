"""Datasets of several domains laid out ``<domain>/<class>/<image>``: the ``domains`` and ``pacs`` loaders.

PACS (Li, Yang, Song, Hospedales, *Deeper, Broader and Artier Domain Generalization*, ICCV 2017:
7 classes in 4 domains, photo, art painting, cartoon, sketch; 9,991 images of 227x227) is
distributed in this layout (its ``kfold/`` folder; DomainBed's copy is ``PACS/<domain>/<class>/``).
It has no train / test split of its own, so each image goes to the test split when a hash of its
``<domain>/<class>/<file>`` path falls below ``test_fraction``: stable across machines,
archive orders and copies, about that fraction of every (domain, class), the train and test
images of a domain disjoint. LN-FL (App. C.2, Table 8) splits PACS into 7,907 train and 1,920
test images, a fraction of 0.195. Each image's domain is recorded (``ArrayDataset.domains``) for
the ``domains`` partitioner. Read in one pass from a directory, .tar(.gz) or .zip, decoded once and
cached as ``imagefolder``'s are.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from pydantic import Field

from fedsim.data.archives import archive_members
from fedsim.data.base import DATASETS, ArrayDataset, DatasetLoader, DataSource
from fedsim.data.imagefolder import IMAGE_SUFFIXES, Arrays, ImageDecoder, dataset_name, load_cached
from fedsim.errors import DataError

PACS_URL = "https://domaingeneralization.github.io/#data"
_HASH_SPAN = 2**32


def in_test_split(relative_path: str, test_fraction: float) -> bool:
    """True for the images the hash split puts in the test split (``relative_path``: <domain>/<class>/<file>)."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") < test_fraction * _HASH_SPAN


@DATASETS.register("domains")
class Domains(DatasetLoader):
    """<domain>/<class>/*.jpg|png (PACS's layout) in a directory or archive; domains recorded, hash test split."""

    class Params(DatasetLoader.Params):
        test_fraction: float = Field(0.2, gt=0, lt=1, description="share of each domain's images in the test split")
        size: int | None = Field(None, ge=8, description="resize every image to size x size (default: keep)")

    params: Params

    def load(self, source: DataSource) -> ArrayDataset:
        root = source.root.resolve()
        if not root.exists():
            raise DataError(self.missing(root))
        p = self.params
        name = dataset_name(root)
        prefix = f"domains-{name}-t{p.test_fraction}-s{p.size}"
        return load_cached(root, source.cache_dir, prefix, self._decode, name)

    def missing(self, root: Path) -> str:
        return (
            f"domains: nothing at {root}; set data.root to a directory or .tar(.gz) / .zip archive holding "
            f"<domain>/<class>/<image> (.jpg or .png)"
        )

    def _decode(self, root: Path) -> Arrays:
        decoder = ImageDecoder(root, self.params.size)
        for member, read in archive_members(root):
            parts = PurePosixPath(member).parts
            if len(parts) < 3 or any(p.startswith((".", "__MACOSX")) for p in parts):
                continue
            domain, cls, file = parts[-3:]  # wrapper folders above the domains (PACS/kfold/) are skipped
            if PurePosixPath(file).suffix.lower() in IMAGE_SUFFIXES:
                split = "test" if in_test_split(f"{domain}/{cls}/{file}", self.params.test_fraction) else "train"
                decoder.add(split, cls, member, read(), domain=domain)
        for split in ("train", "test"):
            if not decoder.images[split]:
                raise DataError(
                    f"{root}: no {split} images; expected <domain>/<class>/<image>.jpg|.png "
                    f"(test_fraction={self.params.test_fraction} of them go to the test split)"
                )
        return decoder.finish()


@DATASETS.register("pacs")
class PACS(Domains):
    """PACS (Li et al. 2017): 7 classes in 4 domains, <domain>/<class>/*.jpg; fedsim does not download it."""

    def missing(self, root: Path) -> str:
        return (
            f"pacs: PACS not found at {root}; get it from {PACS_URL} (the 'kfold' images: "
            f"<domain>/<class>/*.jpg, 4 domains, 7 classes, 9,991 images) and set data.root to that folder or an "
            f"archive of it; fedsim does not download it"
        )
