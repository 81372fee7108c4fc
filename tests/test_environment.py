"""A fault of the environment a run meets before it records anything (a temp directory Ray cannot write, an
address-space limit too low for torch or Ray, a deleted working directory, a library that does not load) is one
line naming the cause and what to change, status 2, and the run leaves nothing behind: the run directory it made
is removed, one it was given is left as it was."""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fedsim
from fedsim.errors import FedsimError
from tests.conftest import REPO, small_config, write_config
from tests.fault_lines import assert_said, fault_line

RAY = {"simulation": {"backend": "ray", "threads": 1}}
MIB = 2**20


def run_cli(
    tmp_path: Path,
    cfg: dict,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    preexec_fn: Callable[[], None] | None = None,
) -> tuple[int, list[str]]:
    """``fedsim run`` on ``cfg`` as a user starts it: its exit status and its stderr's lines."""
    res = subprocess.run(
        [sys.executable, "-m", "fedsim.app.cli", "run", str(write_config(tmp_path, cfg))], cwd=cwd, text=True,
        capture_output=True, env={**os.environ, **(env or {})}, preexec_fn=preexec_fn, timeout=600,
    )  # fmt: skip
    return res.returncode, res.stderr.splitlines()


def runs_made(tmp_path: Path) -> list[Path]:
    """The run directories under the config's output.dir (which the run may have made, empty)."""
    runs = tmp_path / "runs"
    return sorted(runs.iterdir()) if runs.exists() else []


def unwritable_dir(path: Path) -> Path:
    """A directory nobody here can create anything in: mode 555, or, for root (whom modes do not stop),
    immutable (chattr +i); the test is skipped where neither holds."""
    path.mkdir()
    path.chmod(0o555)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root without chattr +i: no directory here is unwritable")
    return path


def writable_again(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    path.chmod(0o755)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a path short enough for Ray's sockets below it (pytest's tmp_path is not)."""
    path = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def limit_address_space(nbytes: int) -> Callable[[], None]:
    """A pre-exec hook: the child's address space limited to ``nbytes`` (``ulimit -v``)."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))


@pytest.mark.slow
def test_a_temp_dir_ray_cannot_write_is_one_line_and_leaves_no_run_dir(tmp_path: Path, short_dir: Path) -> None:
    temp = unwritable_dir(short_dir / "ro")
    try:
        code, err = run_cli(tmp_path, small_config(tmp_path, **RAY), env={"TMPDIR": str(temp)})
    finally:
        writable_again(temp)
    assert (code, len(err)) == (2, 1), err
    why = fault_line("ray temp dir unwritable", why=".+")  # whatever stops the write (not root's permissions)
    assert_said("ray temp dir", err[0], temp=re.escape(str(temp)), variable="TMPDIR", why=why)
    assert runs_made(tmp_path) == []  # the run directory it made is gone, .lock and .fedsim with it


@pytest.mark.slow
def test_a_temp_dir_that_is_a_file_or_too_long_for_rays_sockets_is_one_line(tmp_path: Path, short_dir: Path) -> None:
    """RAY_TMPDIR a file; TMPDIR so long that Ray's socket paths under it would pass AF_UNIX's 107 bytes. The run
    was given an output.run_dir, empty: it is left as it was."""
    (short_dir / "a-file").write_text("")
    too_long = short_dir / ("x" * 40)
    given = tmp_path / "given"
    given.mkdir()
    cases = [("RAY_TMPDIR", short_dir / "a-file", fault_line("ray temp dir unwritable", why="Not a directory")),
             ("TMPDIR", too_long, fault_line("ray temp dir too long", most=43))]  # fmt: skip
    for variable, temp, why in cases:
        cfg = small_config(tmp_path, **RAY, output={"run_dir": str(given)})
        code, err = run_cli(tmp_path, cfg, env={variable: str(temp)})
        assert (code, len(err)) == (2, 1), err
        assert_said("ray temp dir", err[0], temp=re.escape(str(temp)), variable=variable, why=why)
        assert list(given.iterdir()) == []
    assert not (too_long / "ray").exists()  # Ray never started there (it left a session directory behind)


def test_an_address_space_too_small_for_torch_is_one_line(tmp_path: Path) -> None:
    code, err = run_cli(tmp_path, small_config(tmp_path), preexec_fn=limit_address_space(512 * MIB))
    assert (code, len(err)) == (2, 1), err
    assert_said("libraries over the limit", err[0], kib=512 * 1024)
    assert runs_made(tmp_path) == []


def address_space_of_a_run() -> int:
    """The peak address space of a process that loads what a run loads (torch, Flower): its VmPeak."""
    code = "import fedsim.engines.runner; print(open('/proc/self/status').read())"
    status = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(next(line for line in status.splitlines() if line.startswith("VmPeak:")).split()[1]) * 1024


@pytest.mark.long
@pytest.mark.slow
def test_an_address_space_too_small_for_ray_is_one_line(tmp_path: Path) -> None:
    """Room for torch and Flower and 1 GiB more: not for Ray, whose object store (30% of this machine's memory)
    is mapped whole by its servers."""
    if 0.3 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") < 2 * 2**30:
        pytest.skip("a machine whose Ray object store would fit in the 1 GiB left")
    limit = address_space_of_a_run() + 2**30
    code, err = run_cli(tmp_path, small_config(tmp_path, **RAY), preexec_fn=limit_address_space(limit))
    assert (code, len(err)) == (2, 1), err
    assert_said("ray over the limit", err[0], kib=limit // 1024)
    assert runs_made(tmp_path) == []


def test_a_deleted_working_directory_is_one_line(tmp_path: Path) -> None:
    """The command started in a directory deleted before it runs (the hook runs after the child's chdir)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    code, err = run_cli(tmp_path, small_config(tmp_path), cwd=gone, preexec_fn=lambda: os.rmdir(gone))
    assert (code, len(err)) == (2, 1), err
    assert_said("working directory gone", err[0])
    assert runs_made(tmp_path) == []


def test_a_deleted_working_directory_from_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fedsim.run with a relative output.dir, in a directory deleted since: the same error, nothing made."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(FedsimError, match="^the working directory no longer exists"):
        fedsim.run(small_config(tmp_path, output={"dir": "runs"}))


def test_a_broken_library_on_ld_library_path_is_one_line(tmp_path: Path) -> None:
    """A C++ runtime that is no library (an empty file) first on LD_LIBRARY_PATH: torch's extension, the first
    library ``fedsim run`` loads, fails to load it."""
    broken = tmp_path / "lib"
    broken.mkdir()
    (broken / "libstdc++.so.6").write_bytes(b"")
    code, err = run_cli(tmp_path, small_config(tmp_path), env={"LD_LIBRARY_PATH": str(broken)})
    assert (code, len(err)) == (2, 1), err
    why = re.escape(f"{broken}/libstdc++.so.6: file too short")
    assert_said("library broken on LD_LIBRARY_PATH", err[0], library="torch", why=why, dir=re.escape(str(broken)))
    assert runs_made(tmp_path) == []


@pytest.mark.slow
def test_a_package_whose_library_is_missing_is_one_line(tmp_path: Path) -> None:
    """A copy of an environment that lost a shared library: a package on the path whose extension cannot load
    (here a stand-in for grpc, which Flower imports)."""
    shadow = tmp_path / "shadow" / "grpc"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ImportError('libgrpc.so: cannot open shared object file: No such file or directory')\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    code, err = run_cli(tmp_path, small_config(tmp_path), env=env)
    assert (code, len(err)) == (2, 1), err
    why = re.escape("libgrpc.so: cannot open shared object file: No such file or directory")
    assert_said("library missing", err[0], library="grpc", why=why, dist="grpcio")
    shutil.rmtree(shadow.parent)
    assert runs_made(tmp_path) == []
