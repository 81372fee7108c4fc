"""``fedsim deploy``: a real SuperLink and SuperNode processes on this host, run through the CLI as a
user would. Each test checks that no process of the deployment outlives it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.ports import free_port
from fedsim.record.checkpoint import Checkpoint
from tests.conftest import REPO, ip_command, small_config, write_config
from tests.fault_lines import assert_said, assert_said_among

pytestmark = pytest.mark.slow

NUMBERS = ("round", "train_loss", "client_mean_acc", "global_acc", "client_acc")


def deploy_config(tmp_path: Path, **sections: dict) -> dict:
    cfg = small_config(tmp_path, train={"rounds": 2, "num_clients": 2, "local_steps": 3}, eval={"every": 2})
    cfg["output"]["dir"] = "runs"  # relative, as in a user's config: launch() runs in tmp_path
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def launch(tmp_path: Path, cfg: dict, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """``fedsim deploy`` of ``cfg`` as a process; ``sigint_ignored``: as a script's background job starts it."""
    return fedsim_deploy(tmp_path, str(write_config(tmp_path, cfg)), sigint_ignored=sigint_ignored)


def fedsim_deploy(cwd: Path, *args: str, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    # the repository on the path: a config may name a test plugin (tests.plugins...) that the deployed ServerApp
    # and ClientApps import, and the command runs in cwd, outside the repository
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "fedsim.app.cli", "deploy", *args], cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path},
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
    )  # fmt: skip


def run_dir_of(tmp_path: Path) -> Path:
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


def processes_of(run_dir: Path) -> list[int]:
    """Live processes started for this run: their FLWR_HOME lies under the run's deploy directory."""
    marker = f"FLWR_HOME={run_dir / 'deploy'}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes():
                if (proc / "stat").read_text().split()[2] != "Z":
                    pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def supernode_pid(run_dir: Path, partition: int) -> int:
    for pid in processes_of(run_dir):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile (a ClientApp process)
            continue
        if any(b"fedsim-supernode" in part for part in cmdline) and f"partition-id={partition} ".encode() in b" ".join(
            cmdline
        ):
            return pid
    raise AssertionError(f"no SuperNode process for partition {partition}")


def reached(tmp_path: Path, proc: subprocess.Popen[str], at_least: int) -> Path | None:
    """The run directory once the launched run has finished round ``at_least``, else None."""
    assert proc.poll() is None, proc.communicate()
    runs = tmp_path / "runs"
    if runs.exists() and any(runs.iterdir()):
        progress = run_dir_of(tmp_path) / "progress.json"
        if progress.exists() and json.loads(progress.read_text())["round"] >= at_least:
            return run_dir_of(tmp_path)
    return None


def wait_for_round(tmp_path: Path, proc: subprocess.Popen[str], at_least: int, timeout: float = 300) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run_dir := reached(tmp_path, proc, at_least):
            return run_dir
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"round {at_least} not reached in {timeout} s")


def finish(proc: subprocess.Popen[str], timeout: float = 400) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out, err


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_numbers(deployed: list[dict], simulated: list[dict]) -> None:
    assert len(deployed) == len(simulated)
    for d, s in zip(deployed, simulated, strict=True):
        for key in NUMBERS:
            assert d[key] == pytest.approx(s[key], rel=1e-5, abs=1e-6), key


@pytest.mark.long
def test_killed_deploy_resumes_to_the_simulation_metrics_and_stops_every_process(tmp_path: Path) -> None:
    """A deployed run whose SuperLink and ServerApp are SIGKILLed as round 2 starts, after round 1's checkpoint
    (tests/plugins/superlink_killer.py: at that round on any machine, no watcher racing the run), continued by
    `fedsim deploy --resume RUN_DIR` on new SuperNodes, which load SCAFFOLD's c_i of round 1 from the checkpoint:
    the metrics of an uninterrupted `fedsim run` (the plugin is SCAFFOLD otherwise)."""
    killer = {"name": "tests.plugins.superlink_killer:KillSuperLink", "kill_round": 2}
    # progress shown: the run dir records the user's choice (not the SuperLink's ServerApp's silence), which
    # the resumed launcher shows
    every_round = {"train": {"rounds": 3}, "eval": {"every": 1}, "output": {"checkpoint_every": 1, "progress": True}}
    cfg = deploy_config(tmp_path, strategy=killer, **every_round)
    rc, _, err = finish(launch(tmp_path, cfg))
    assert rc == 2, err[-3000:]
    assert_said_among("superlink exited", err)
    run_dir = run_dir_of(tmp_path)
    assert wait_no_processes(run_dir, timeout=60) == []
    assert Checkpoint.load(run_dir).round == 1 and not (run_dir / "summary.json").exists()
    states = sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "client_state").rglob("*.bin"))
    assert states == ["client_state/partition-0/round-1.bin", "client_state/partition-1/round-1.bin"]

    assert yaml.safe_load((run_dir / "config.yaml").read_text())["output"]["progress"] is True
    rc, out, err = finish(fedsim_deploy(tmp_path, "--resume", str(run_dir)))
    assert rc == 0, err[-3000:]
    assert "fedsim run summary" in out + err and "resumed_from_round" in out + err
    assert Path(out.strip().splitlines()[-1]) == run_dir.resolve()
    assert processes_of(run_dir) == []
    for name in ("config.yaml", "partition.csv", "metrics.jsonl", "summary.json", "model.pt"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_round"] == 1
    logs = run_dir / "deploy"
    assert {p.name for p in logs.glob("*.log")} >= {"superlink.log", "supernode-0.log", "supernode-1.log"}
    assert (logs / "superlink.log").read_text().count("Starting Flower SuperLink") == 2  # the killed run's kept

    inline = small_config(tmp_path / "inline", strategy={"name": "scaffold"}, train=cfg["train"], eval=cfg["eval"])
    simulated = metrics(Path(run(parse_config(inline))["run_dir"]))
    assert [m["round"] for m in simulated] == [1, 2, 3]
    assert_same_numbers(metrics(run_dir), simulated)


@pytest.mark.long
@pytest.mark.hosts  # .ci/run runs it after the README's suite, which stays under its time
def test_a_killed_serverapp_ends_the_deploy_with_its_log_and_stops_every_process(tmp_path: Path) -> None:
    """A ServerApp SIGKILLed as round 2 starts writes neither summary nor error: the launcher, which watches that
    process, says so in one line naming its log and stops everything; the run directory keeps round 1's
    checkpoint for `fedsim deploy --resume`."""
    killer = {"name": "tests.plugins.superlink_killer:KillSuperLink", "kill_round": 2, "kill_superlink": False}
    cfg = deploy_config(tmp_path, strategy=killer, train={"rounds": 3}, output={"checkpoint_every": 1})
    rc, _, err = finish(launch(tmp_path, cfg))
    lines = [line for line in err.splitlines() if line.startswith("fedsim: error:")]
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert_said("serverapp ended", lines[0])
    assert (run_dir_of(tmp_path) / "deploy" / "serverapp.log").is_file()
    run_dir = run_dir_of(tmp_path)
    assert wait_no_processes(run_dir, timeout=60) == []
    assert Checkpoint.load(run_dir).round == 1 and not (run_dir / "summary.json").exists()


def test_deploy_resume_refuses_what_it_cannot_continue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each in one line, before any process starts, as `fedsim run --resume` says it (tests/test_resume.py)."""
    from fedsim.app.cli import main

    def error(*argv: str) -> str:
        assert main(["deploy", *argv]) == 2
        return capsys.readouterr().err

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert "not a run directory (no config.yaml)" in error("--resume", str(run_dir))
    assert "--resume RUN_DIR" in error()  # the wording of these two: the corpus (deploy-*)
    config = write_config(run_dir, deploy_config(tmp_path, output={"checkpoint_every": 1}), "config.yaml")
    both = error(str(config), "--resume", str(run_dir))
    assert "--resume RUN_DIR" in both and "--set" in both
    message = error("--resume", str(run_dir))
    assert "no checkpoint.pt to resume from" in message and "this run: 1" in message
    (run_dir / "summary.json").write_text("{}")
    assert "the run already finished (summary.json exists)" in error("--resume", str(run_dir))
    assert list(tmp_path.glob("runs/*")) == []  # nothing started, nothing made


def wait_no_processes(run_dir: Path, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := processes_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def superlink_pid(run_dir: Path) -> int:
    for pid in processes_of(run_dir):
        with contextlib.suppress(OSError):  # a ClientApp process may end meanwhile
            if b"flower-superlink" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError("no SuperLink process")


@pytest.mark.long
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_stopping_the_launcher_stops_every_process(tmp_path: Path, sig: signal.Signals) -> None:
    port = free_port("127.0.0.1")
    # started with SIGINT ignored, as `fedsim deploy ... &` in a script: a SIGINT sent to it still stops
    # the run (it once reached only the launcher outside the private network, and the run went on)
    proc = launch(tmp_path, deploy_config(tmp_path, train={"rounds": 50}, deploy={"port": port}), sigint_ignored=True)
    run_dir = wait_for_round(tmp_path, proc, 1)
    assert len(processes_of(run_dir)) >= 3  # the SuperLink and two SuperNodes at least
    # the run is in a network of its own: its SuperLink's unauthenticated Control API is out of reach here
    superlink = superlink_pid(run_dir)
    assert os.readlink(f"/proc/{superlink}/ns/net") != os.readlink("/proc/self/ns/net")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    proc.send_signal(sig)
    rc, _, err = finish(proc)
    if sig == signal.SIGINT:  # the launcher stops its processes itself, then exits
        assert rc == 130, err[-3000:]
        assert "interrupted" in err
        assert processes_of(run_dir) == []
    else:  # killed outright: its children's parent-death signal and its watchdog stop them
        assert rc == -signal.SIGKILL
        assert wait_no_processes(run_dir, timeout=60) == []
    assert not (run_dir / "summary.json").exists()


@pytest.mark.long
def test_killed_supernode_is_skipped_or_stops_the_run(tmp_path: Path) -> None:
    """Both policies side by side: Flower declares a SuperNode dead after two heartbeat intervals without a
    heartbeat (20 s under fedsim-supernode, fedsim.deploy.flower_waits), and the two runs wait for that at
    the same time. SuperNode 1 is killed while the server waits before round 2 (tests/plugins/hold_at_round.py):
    after round 1's replies, before round 2's Messages, on any machine (a kill that raced round 2 could land
    while the node was sending its reply, which Flower then reports for every reply of the round)."""
    train = {"rounds": 3, "round_timeout_s": 120}
    runs, holds = {}, {}
    for policy in ("skip", "fail"):
        (tmp_path / policy).mkdir()
        holds[policy] = tmp_path / policy / "hold"
        holds[policy].write_text("2")
        strategy = {"name": "tests.plugins.hold_at_round:HoldAtRound", "hold_file": str(holds[policy])}
        strategy["side"] = "server"
        cfg = deploy_config(tmp_path / policy, strategy=strategy, train={**train, "on_client_failure": policy},
                            eval={"every": 3})  # fmt: skip
        runs[policy] = launch(tmp_path / policy, cfg)
    run_dirs: dict[str, Path] = {}
    deadline = time.monotonic() + 300
    try:
        while len(run_dirs) < len(runs):  # kill SuperNode 1 of each run while its server waits before round 2
            assert time.monotonic() < deadline, f"round 2 not reached in 300 s by {set(runs) - set(run_dirs)}"
            for policy, proc in runs.items():
                assert proc.poll() is None, proc.communicate()
                if policy not in run_dirs and list(holds[policy].parent.glob("hold.*")):
                    run_dir = run_dir_of(tmp_path / policy)
                    os.killpg(supernode_pid(run_dir, 1), signal.SIGKILL)  # the SuperNode and its ClientApp
                    run_dirs[policy] = run_dir
                    holds[policy].unlink()  # round 2 goes on, without SuperNode 1
            time.sleep(0.5)
    except BaseException:
        for proc in runs.values():
            proc.kill()  # its SuperLink and SuperNodes die with it
        raise
    (rc_skip, _, err_skip), (rc_fail, _, err_fail) = finish(runs["skip"]), finish(runs["fail"])
    assert processes_of(run_dirs["skip"]) == processes_of(run_dirs["fail"]) == []

    assert rc_fail == 2, err_fail[-3000:]
    assert_said_among("client failed, run stopped", err_fail, round=2, client=1)
    assert not (run_dirs["fail"] / "summary.json").exists()

    assert rc_skip == 0, err_skip[-3000:]
    (last,) = metrics(run_dirs["skip"])
    assert last["round"] == 3
    assert {r: p for r, p in last["failed_clients"].items()} == {"2": [1], "3": [1]}
    assert last["client_acc"][1] is None and last["client_acc"][0] is not None


# --- several hosts: SuperNodes in a network namespace of their own, TLS and SuperNode auth ------------


@pytest.fixture
def nodes_namespace() -> tuple[str, str, str]:
    """A namespace ``nodes`` joined to this one by a veth pair on a private /24 of our own:
    (namespace, this side's address, this side's interface)."""
    tag = os.getpid() % 10000
    ns, here, there = f"fsim{tag}", f"fsa{tag}", f"fsb{tag}"
    subnet = f"10.231.{tag % 250}"
    try:
        ip_command("netns", "add", ns)
    except (PermissionError, FileNotFoundError) as err:
        pytest.skip(f"this machine forbids network namespaces ({err}): the multi-host test needs them")
    try:
        ip_command("link", "add", here, "type", "veth", "peer", "name", there)
        ip_command("link", "set", there, "netns", ns)
        ip_command("addr", "add", f"{subnet}.1/24", "dev", here)
        ip_command("link", "set", here, "up")
        ip_command("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/24", "dev", there)
        ip_command("netns", "exec", ns, "ip", "link", "set", there, "up")
        ip_command("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, f"{subnet}.1", here
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def listening(pid: int) -> set[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3] for line in out.splitlines() if f"pid={pid}," in line}


@pytest.mark.long
@pytest.mark.hosts  # .ci/run runs it after the README's suite, which stays under its time
def test_tls_and_supernode_auth_across_network_namespaces(
    tmp_path: Path, nodes_namespace: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    """Two hosts for real: the SuperNodes in a network namespace of their own, joined to the SuperLink's by a
    veth pair, with TLS naming the SuperLink's address and SuperNode authentication. The SuperLink and its
    ServerApp are killed as round 2 starts (tests/plugins/superlink_killer.py), and `fedsim deploy --resume`'s
    deployment goes on across the two namespaces: the metrics of an uninterrupted `fedsim run`."""
    from fedsim.deploy.launcher import deploy
    from fedsim.errors import FedsimError
    from fedsim.record.checkpoint import resume_config

    ns, address, interface = nodes_namespace
    # the deployment's processes import the test plugin, as fedsim_deploy's do
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    killer = {"name": "tests.plugins.superlink_killer:KillSuperLink", "kill_round": 2}
    hosts = {"address": address, "tls": True, "supernode_auth": True}
    cfg = parse_config(deploy_config(tmp_path, strategy=killer, train={"rounds": 3}, eval={"every": 1},
                                     output={"checkpoint_every": 1}, deploy=hosts))  # fmt: skip
    cfg.output.progress, cfg.output.dir = False, str(tmp_path / "runs")
    wrap = {"supernode": ["ip", "netns", "exec", ns]}
    with pytest.raises(FedsimError, match="the SuperLink exited"):
        deploy(cfg, wrap=wrap)
    run_dir = run_dir_of(tmp_path)
    assert wait_no_processes(run_dir, timeout=60) == []
    assert Checkpoint.load(run_dir).round == 1
    rx_before = int(Path(f"/sys/class/net/{interface}/statistics/rx_bytes").read_text())
    seen: dict[str, set[str]] = {}

    def watch() -> None:  # what the SuperLink listens on while the run is live
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not seen:
            for live in (tmp_path / "runs").glob("*"):
                for pid in processes_of(live):
                    try:  # a process may end between the scan and these reads
                        if b"flower-superlink" in Path(f"/proc/{pid}/cmdline").read_bytes():
                            if addrs := listening(pid):
                                seen["superlink"] = addrs
                    except OSError:
                        continue
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    summary = deploy(resume_config(run_dir), wrap=wrap, resume=True)
    watcher.join(timeout=5)
    assert Path(summary["run_dir"]) == run_dir and summary["resumed_from_round"] == 1
    assert processes_of(run_dir) == []

    assert seen["superlink"] == {f"{address}:{tmp_port(run_dir)}"}  # nothing on loopback or elsewhere
    # the SuperNodes' only way out is the veth: the model went both ways across it
    model_bytes = (run_dir / "model.pt").stat().st_size
    assert int(Path(f"/sys/class/net/{interface}/statistics/rx_bytes").read_text()) - rx_before > model_bytes
    supernode_log = (run_dir / "deploy" / "supernode-0.log").read_text()
    assert "--insecure" not in supernode_log and "TLS disabled" not in supernode_log
    assert "SuperNode authentication is disabled" not in (run_dir / "deploy" / "superlink.log").read_text()

    inline = small_config(tmp_path / "inline", strategy={"name": "scaffold"}, train=cfg.train.model_dump(),
                          eval=cfg.eval.model_dump())  # fmt: skip
    simulated = metrics(Path(run(parse_config(inline))["run_dir"]))
    assert [m["round"] for m in simulated] == [1, 2, 3]
    assert_same_numbers(metrics(run_dir), simulated)


def tmp_port(run_dir: Path) -> int:
    """The SuperLink's port, as the launcher gave it to the flwr CLI."""
    import tomllib

    conn = tomllib.loads((run_dir / "deploy" / "flwr" / "config.toml").read_text())["superlink"]["fedsim"]
    return int(conn["address"].rsplit(":", 1)[1])


def test_flwr_run_dot_runs_the_repository_as_a_flower_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What docs/deployment.md says: SuperLink + SuperNodes, then `flwr run . <superlink> --run-config config=...`."""
    from fedsim.config_file import load_config
    from fedsim.deploy.launcher import LocalDeployment
    from fedsim.deploy.topology import CONNECTION

    monkeypatch.chdir(tmp_path)  # the SuperLink's working directory: the run lands in ./runs
    # the deployment's processes import this repository's fedsim, as fedsim_deploy's do, not another installed one
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cfg = load_config(REPO / "configs" / "deploy_smoke.yaml")
    cfg.output.run_dir = str(tmp_path / "launcher")
    with LocalDeployment(cfg) as dep:
        dep.start()
        dep.flwr(["run", str(REPO), CONNECTION, "--run-config", "config='configs/deploy_smoke.yaml'"])
        deadline = time.monotonic() + 600
        while not list(tmp_path.glob("runs/deploy-smoke-*/summary.json")):
            assert time.monotonic() < deadline and dep.alive("superlink")
            assert not list(tmp_path.glob("runs/deploy-smoke-*/error.txt"))
            time.sleep(0.5)
    (run_dir,) = tmp_path.glob("runs/deploy-smoke-*")
    # `flwr run` hands the ServerApp and ClientApps the file as it is: threads auto, one per SuperNode
    inline = [f"output.dir={tmp_path / 'sim'}", "simulation.backend=inline", "simulation.threads=1"]
    simulated = run(load_config(REPO / "configs" / "deploy_smoke.yaml", inline))
    assert_same_numbers(metrics(run_dir), metrics(Path(simulated["run_dir"])))
