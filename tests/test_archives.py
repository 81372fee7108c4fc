"""Reading a dataset's files in one pass (fedsim/data/archives.py): a directory, a tar in each compression and a zip
give their regular files' paths and bytes, in a fixed order; a member pointing outside the archive, data after a
tar's end and a file that is no archive are errors naming it. Damaged members, headers and checksums, and what a
run does with them: tests/test_data_integrity.py."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from fedsim.data.archives import archive_members
from fedsim.errors import DataError

FILES = {"b/2.txt": b"two", "a/1.txt": b"one", "top.txt": b"top", "a/0.txt": b""}  # out of order on purpose


def read_all(root: Path) -> list[tuple[str, bytes]]:
    return [(name, read()) for name, read in archive_members(root)]


def tar_of(path: Path, files: dict[str, bytes], mode: str = "w", directory: str | None = None) -> Path:
    with tarfile.open(path, mode) as tar:
        if directory is not None:  # a directory entry, which is no member to read
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_directory_gives_every_file_by_its_relative_path_files_before_subfolders_each_sorted(tmp_path: Path) -> None:
    for name, data in FILES.items():
        (tmp_path / "d" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "d" / name).write_bytes(data)
    # a folder's own files first (sorted), then its subfolders in sorted order: whatever order they were made in
    assert read_all(tmp_path / "d") == [("top.txt", b"top"), ("a/0.txt", b""), ("a/1.txt", b"one"), ("b/2.txt", b"two")]


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_a_tar_in_any_compression_gives_its_files_in_archive_order(tmp_path: Path, mode: str) -> None:
    """The compression is told by the file's magic number, not its name (every one here is called data.bin)."""
    archive = tar_of(tmp_path / "data.bin", FILES, mode, directory="a/")
    assert read_all(archive) == list(FILES.items())


def test_a_zip_gives_its_files_in_archive_order_without_its_directories(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "data.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a/", b"")
        for name, data in FILES.items():
            z.writestr(name, data)
    assert read_all(tmp_path / "data.zip") == list(FILES.items())


@pytest.mark.parametrize("member", ["../up.txt", "a/../../up.txt", "/etc/passwd", "\\windows.txt"])
@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_a_member_pointing_outside_the_archive_is_refused_by_name(tmp_path: Path, member: str, kind: str) -> None:
    files = {"ok.txt": b"1", member: b"2"}
    if kind == "tar":
        archive = tar_of(tmp_path / "a.tar", files)
    else:
        archive = tmp_path / "a.zip"
        with zipfile.ZipFile(archive, "w") as z:
            for name, data in files.items():
                z.writestr(zipfile.ZipInfo(name), data)  # a ZipInfo: zipfile keeps the name as given
    with pytest.raises(DataError) as err:
        read_all(archive)
    assert str(err.value) == f"dataset archive {archive}: member {member!r} points outside the archive ('/' or '..')"


@pytest.mark.parametrize("after", [b"junk", b"tar"])
def test_data_after_a_tars_end_is_an_error_not_ignored(tmp_path: Path, after: bytes) -> None:
    """Past the end-of-archive marker only zeros may follow: anything else is a damaged header (tarfile would end
    there) or a second archive appended (its members would be lost). ``b"tar"``: the same tar twice."""
    raw = tar_of(tmp_path / "one.tar", {"a.txt": b"hello"}).read_bytes()
    (tmp_path / "two.tar").write_bytes(raw + (raw if after == b"tar" else after))
    with pytest.raises(DataError) as err:
        read_all(tmp_path / "two.tar")
    assert str(err.value) == (
        f"dataset archive {tmp_path / 'two.tar'}: the tar ends after member 'a.txt' but data follows: a damaged "
        "header or two archives in one file"
    )
    (tmp_path / "padded.tar").write_bytes(raw + bytes(3 * 512))  # zeros are padding: read as the one member
    assert read_all(tmp_path / "padded.tar") == [("a.txt", b"hello")]


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"", "empty header"), (b"not an archive", "truncated header"), (bytes(range(256)) * 3, "invalid header")],
)
def test_a_file_that_is_no_archive_is_named_with_tarfiles_reason(tmp_path: Path, content: bytes, reason: str) -> None:
    (tmp_path / "data.bin").write_bytes(content)
    with pytest.raises(DataError) as err:
        read_all(tmp_path / "data.bin")
    assert str(err.value) == f"dataset {tmp_path / 'data.bin'}: not a readable directory, tar or zip archive ({reason})"
