"""Every file of a dataset directory, tar or zip, in one pass, read to the end and checked.

A damaged archive is an error naming the member where it broke, never a dataset that silently ends
early: Python's ``tarfile`` takes the first header it cannot read for the end of the archive (one
flipped byte in a header of the CIFAR-10 archive dropped its last two test classes), and its stream
reader never checks gzip's CRC-32 and length. So a tar is decompressed by ``gzip`` / ``bz2`` / ``lzma``
themselves, which check their trailer when read to the end; every header must pass tar's checksum;
and what follows the end-of-archive marker must be the zeros that pad it. A zip's members are
checked against their CRC-32 as they are read (``zipfile``).
"""

from __future__ import annotations

import bz2
import functools
import gzip
import lzma
import os
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from fedsim.errors import DataError

Member = tuple[str, Callable[[], bytes]]  # (relative POSIX path, reads its bytes)

# What a damaged compressed stream or file raises as it is read (BadGzipFile and bz2's are OSErrors)
READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile)
# Magic numbers of the compressions a tar may come in, and their readers
_DECOMPRESSORS: dict[bytes, Callable[[Path], BinaryIO]] = {
    b"\x1f\x8b": lambda p: gzip.open(p, "rb"),
    b"BZh": lambda p: bz2.open(p, "rb"),
    b"\xfd7zXZ\x00": lambda p: lzma.open(p, "rb"),
}


def archive_members(root: Path) -> Iterator[Member]:
    """Every regular file under the directory ``root``, or in the tar(.gz/.bz2/.xz) or zip ``root``, in one
    pass. Reading a member that is damaged, or reaching a damaged header, raises :class:`DataError`."""
    if root.is_dir():
        yield from _directory_members(root)
    elif zipfile.is_zipfile(root):
        yield from _zip_members(root)
    else:
        yield from _tar_members(root)


def _checked_read(root: Path, member: str, read: Callable[[], bytes]) -> Callable[[], bytes]:
    def read_member() -> bytes:
        try:
            return read()
        except READ_ERRORS as err:
            raise DataError(f"dataset archive {root}: member {member!r} is damaged ({err})") from err

    return read_member


def _inside(root: Path, member: str) -> str:
    """An archive member's name, refused when it points outside the archive (fedsim never unpacks one, but
    such a name means the archive was made to be unpacked somewhere it should not be)."""
    parts = PurePosixPath(member).parts
    if member.startswith(("/", "\\")) or ".." in parts:
        raise DataError(f"dataset archive {root}: member {member!r} points outside the archive ('/' or '..')")
    return member


def _directory_members(root: Path) -> Iterator[Member]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            full = Path(dirpath, f)
            name = full.relative_to(root).as_posix()
            yield name, _checked_read(root, name, full.read_bytes)


def _zip_members(root: Path) -> Iterator[Member]:
    try:
        with zipfile.ZipFile(root) as archive:
            # zipfile reads its central directory by the byte size the end record gives, never checking the
            # member count the record also gives: a directory that lost entries would read as a smaller archive
            with open(root, "rb") as f:
                promised = zipfile._EndRecData(f)[zipfile._ECD_ENTRIES_TOTAL]  # zipfile's own reader of that record
            if len(archive.infolist()) != promised:
                raise DataError(
                    f"dataset archive {root}: its directory lists {len(archive.infolist())} members but its end "
                    f"record promises {promised}: the archive is corrupt, get it again"
                )
            for zinfo in archive.infolist():
                if not zinfo.is_dir():
                    name = _inside(root, zinfo.filename)
                    yield name, _checked_read(root, name, functools.partial(archive.read, zinfo))
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"dataset archive {root}: not a readable zip archive ({err})") from err


class _DamagedHeader(Exception):
    """A tar header that fails tar's checks, where ``tarfile`` would end the archive without a word."""


class _CheckedTarInfo(tarfile.TarInfo):
    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        try:
            return super().frombuf(buf, encoding, errors)
        except tarfile.EOFHeaderError:
            raise  # a block of zeros: the end-of-archive marker (that only zeros follow is checked after)
        except tarfile.HeaderError as err:
            if len(buf) < tarfile.BLOCKSIZE:
                raise _DamagedHeader("it ends without tar's end-of-archive marker: cut short") from err
            name = buf[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            raise _DamagedHeader(f"the next header (naming {name!r}) is damaged: {err}") from err


def _open_decompressed(root: Path) -> BinaryIO:
    with open(root, "rb") as f:
        magic = f.read(6)
    opener = next((o for prefix, o in _DECOMPRESSORS.items() if magic.startswith(prefix)), None)
    return opener(root) if opener is not None else open(root, "rb")  # noqa: SIM115 (closed by the caller)


def _tar_members(root: Path) -> Iterator[Member]:
    last = None  # the last member read whole: where a damaged header is
    try:
        with _open_decompressed(root) as stream:
            # "r|": forward only, no seeking back through a compressed stream
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=_CheckedTarInfo) as tar:
                for info in tar:
                    fileobj = tar.extractfile(info) if info.isfile() else None
                    if fileobj is not None:
                        name = _inside(root, info.name)
                        yield name, _checked_read(root, name, fileobj.read)
                    last = info.name
                # to the end of the stream, which has gzip / bz2 / xz check their CRC and length
                while chunk := tar.fileobj.read(1 << 20):
                    if chunk.count(0) != len(chunk):
                        after = f"after member {last!r}" if last else "before any member"
                        raise DataError(
                            f"dataset archive {root}: the tar ends {after} but data follows: a damaged header "
                            "or two archives in one file"
                        )
    except _DamagedHeader as err:
        if last is None:  # the first header: not a tar at all (its own words, not 100 bytes of what is there)
            raise DataError(f"dataset {root}: not a readable directory, tar or zip archive ({err.__cause__})") from err
        raise DataError(f"dataset archive {root}: after member {last!r}, {err}; get the archive again") from err
    except READ_ERRORS as err:
        if last is None:
            raise DataError(f"dataset {root}: not a readable directory, tar or zip archive ({err})") from err
        raise DataError(f"dataset archive {root}: damaged after member {last!r} ({err}); get it again") from err
