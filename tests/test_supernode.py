"""fedsim.deploy.supernode's commands: the ``flwr-clientapp`` and ``flower-superexec`` a SuperNode's SuperExec
finds first on its PATH, in a directory only this user may enter. The fork server behind the first is
tests/test_forkserver.py's; a SuperNode of fedsim's in a deployed run, tests/test_deploy.py's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from fedsim.deploy import clientapp_shim
from fedsim.deploy.supernode import write_commands


def test_the_commands_are_the_shim_and_fedsims_superexec_for_this_user_only(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    write_commands(bin_dir)
    assert sorted(p.name for p in bin_dir.iterdir()) == ["flower-superexec", "flwr-clientapp"]
    for path in [bin_dir, *bin_dir.iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    shim = (bin_dir / "flwr-clientapp").read_text()
    # this interpreter without site-packages (it starts in milliseconds), the shim's code as it is
    assert shim == f"#!{sys.executable} -S\n" + Path(clientapp_shim.__file__).read_text()
    superexec = (bin_dir / "flower-superexec").read_text().splitlines()
    assert superexec[0] == f"#!{sys.executable}" and "from fedsim.deploy.superexec import main" in superexec
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run(["flower-superexec", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("usage: flower-superexec"), res.stderr[-2000:]
