"""``fedsim deploy``: a real Flower deployment on this host, from :class:`Topology`.

It starts a SuperLink and one SuperNode process per client, submits the run with the flwr CLI,
shows the ServerApp's progress from the run directory and stops every process it started, in its
own process group, on success, on error and on Ctrl-C / SIGTERM. ``fedsim deploy --resume RUN_DIR``
does the same for a run whose SuperLink, ServerApp or launcher was killed: the ServerApp goes on from the
run directory's checkpoint, and the new SuperNodes load their clients' state of that round from it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedsim.config import RunConfig
from fedsim.deploy import private_network
from fedsim.deploy.keys import make_node_keys, make_tls
from fedsim.deploy.topology import CONNECTION, RUNTIME_ENV, TlsFiles, Topology, local_topology, write_app
from fedsim.errors import ConfigError, FedsimError
from fedsim.files import make_dirs, open_file, write_file
from fedsim.ports import free_ports
from fedsim.processes import (
    describe,
    die_with_parent,
    listening_pids,
    signals_ignored,
    sigterm_as_interrupt,
    stop_tree,
    tree,
    watchdog,
)
from fedsim.record.claim import claimed
from fedsim.record.layout import ERROR, HELD_ENV, PROGRESS, SUMMARY
from fedsim.record.reader import read_error, read_progress, read_summary
from fedsim.server.console import RoundProgress, console, show_partition, summary_table

# A command prefix per process, e.g. {"supernode": ["ip", "netns", "exec", "nodes"]} to run the
# SuperNodes in another network namespace
Wrap = dict[str, list[str]]
# How the launcher learns that a run ended without its summary (a ServerApp killed, say): its ServerApp process,
# looked for under the SuperLink in /proc every LOOK_EVERY_S (a few ms of CPU), is gone; and, for what /proc
# cannot show (a run stopped or failed before its ServerApp starts), the SuperLink's status, asked every
# STATUS_EVERY_S until the ServerApp is seen, then every STATUS_BACKSTOP_S: ``flwr ls`` is a process of its
# own, about 0.7 s of CPU, which every 10 s was a twentieth of a deployed round's CPU on two cores (and the
# SuperLink marks a killed ServerApp's run failed only after about a minute).
STATUS_EVERY_S = 10.0
LOOK_EVERY_S = 2.0
STATUS_BACKSTOP_S = 60.0


def wait_for_port(host: str, port: int, owner: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    """Wait until ``owner`` (or a process it started) listens on ``port``; another program listening there
    is an error (a run submitted to it would go to a stranger)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if owner.poll() is not None:
            raise FedsimError(f"{what} exited during startup")
        try:
            with socket.create_connection((host, port), timeout=1):
                pass
        except OSError:
            time.sleep(0.2)
            continue
        ours = {pid for pid, _ in tree({owner.pid})}
        if listening_pids(port) & ours:
            return
        if strangers := listening_pids(port) - ours:
            who = "; ".join(describe(pid) for pid in sorted(strangers))
            raise FedsimError(f"port {port} on {host} is taken by another program ({who}): change deploy.port, or 0")
        time.sleep(0.2)  # listening on the address but not yet on the port's other sockets: look again
    raise FedsimError(f"{what} did not listen on {host}:{port} within {timeout:.0f} s (deploy.startup_timeout_s)")


def check_address(address: str) -> None:
    """``deploy.address`` must be an address of this host: the SuperLink listens there."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.bind((address, 0))
    except OSError as err:
        raise ConfigError(
            f"deploy.address = {address!r} is not an address of this host ({err.strerror}): give 127.0.0.1, 0.0.0.0 "
            "(every interface) or one of this host's addresses"
        ) from err


class LocalDeployment:
    """The processes of one deployed run; use as a context manager so they always stop."""

    def __init__(self, cfg: RunConfig, wrap: Wrap | None = None, resume: bool = False) -> None:
        assert cfg.output.run_dir, "fedsim.engines.runner.plan() fixes the run directory first"
        self.cfg, self.resume = cfg, resume
        self.run_dir = Path(cfg.output.run_dir).resolve()  # the flwr CLI runs elsewhere
        self.workdir = self.run_dir / "deploy"
        make_dirs(self.workdir, self.run_dir)
        self.wrap = wrap or {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.topology = self._topology()

    def _topology(self) -> Topology:
        d = self.cfg.deploy
        nodes = ["127.0.0.1"] * self.cfg.train.num_clients
        if d.port:
            port, ports = d.port, free_ports(nodes, taken={d.port})
        else:
            port, *ports = free_ports([d.address, *nodes])
        topo = local_topology(self.cfg, port, ports)
        if d.tls:
            tls = (
                TlsFiles(d.certificates.ca, d.certificates.cert, d.certificates.key)
                if d.certificates is not None
                else make_tls(self.workdir / "tls", [topo.superlink_host, d.address, "localhost"])
            )
            topo = replace(topo, tls=tls)
        if d.supernode_auth:
            self.node_keys = make_node_keys(self.workdir / "node-keys", self.cfg.train.num_clients)
            topo = replace(topo, node_keys=tuple(str(private) for private, _ in self.node_keys))
        return topo

    # --- processes --------------------------------------------------------------------------------

    def _env(self, home: str) -> dict[str, str]:
        from fedsim.engines.runner import OFFLINE_ENV

        home_dir = str(self.workdir / "home" / home)
        # HELD_ENV: this launcher owns the run directory for the ServerApp its SuperLink starts
        return {**os.environ, **OFFLINE_ENV, **RUNTIME_ENV, "FLWR_HOME": home_dir, HELD_ENV: str(self.run_dir)}

    def _spawn(self, name: str, role: str, cmd: list[str]) -> None:
        # appended: a resumed run's logs follow those of the run that was killed
        log = open_file(self.workdir / f"{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            self.procs[name] = subprocess.Popen(
                self.wrap.get(role, []) + cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(name),
                start_new_session=True,  # Ctrl-C reaches this launcher only, which stops them in order
                preexec_fn=die_with_parent(),  # and a launcher killed outright takes them with it
            )  # fmt: skip
        finally:
            os.close(log)

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def start(self) -> None:
        topo, timeout = self.topology, self.cfg.deploy.startup_timeout_s
        self._spawn("superlink", "superlink", topo.superlink_command())
        wait_for_port(topo.superlink_host, topo.superlink_port, self.procs["superlink"], timeout,
                      f"the SuperLink (log: {self.workdir / 'superlink.log'})")  # fmt: skip
        write_app(self.workdir, self.cfg, topo, self.resume)
        if topo.node_keys is not None:
            for _, public in self.node_keys:
                self.flwr(["supernode", "register", str(public), CONNECTION])
        for pid in range(topo.num_nodes):
            self._spawn(f"supernode-{pid}", "supernode", topo.supernode_command(pid))
        # what the SuperLink and SuperNodes start in turn (ServerApp, SuperExec, ClientApps) outlives a
        # launcher killed outright unless something outside it stops them
        self.watchdog = watchdog({p.pid for p in self.procs.values()})

    def _cli(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        env = {**self._env("cli"), "FLWR_HOME": str(self.workdir / "flwr")}
        return subprocess.run(
            ["flwr", *args], capture_output=True, text=True, env=env, cwd=self.workdir,
            timeout=self.cfg.deploy.startup_timeout_s,
        )  # fmt: skip

    def flwr(self, args: list[str]) -> dict[str, Any]:
        """The flwr CLI against this deployment's SuperLink, JSON output parsed."""
        res = self._cli([*args, "--format", "json"])
        try:
            out = json.loads(res.stdout[res.stdout.index("{") :])
        except ValueError:
            out = {"success": False, "error-message": (res.stdout + res.stderr).strip()[-2000:]}
        if res.returncode != 0 or not out.get("success", True):
            raise FedsimError(f"flwr {' '.join(args[:2])} failed: {out.get('error-message', out)}")
        return out

    def submit(self) -> int:
        out = self.flwr(["run", str(self.workdir / "app"), CONNECTION, "--run-config",
                         str(self.workdir / "run-config.toml")])  # fmt: skip
        return int(out["run-id"])

    def _check_superlink(self, grace: float = 0.0) -> None:
        """A SuperLink that exited, or exits within ``grace`` seconds, ends the run: an error naming its log."""
        try:
            self.procs["superlink"].wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return
        raise FedsimError(f"the SuperLink exited (log: {self.workdir / 'superlink.log'})")

    def serverapp_running(self) -> bool:
        """Whether a ServerApp process runs under the SuperLink (its SuperExec starts one per run)."""
        for pid, _ in tree({self.procs["superlink"].pid}):
            try:
                if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:  # ended since the walk
                continue
        return False

    def run_status(self, run_id: int) -> str:
        runs = self.flwr(["ls", CONNECTION, "--run-id", str(run_id)]).get("runs", [])
        return str(runs[0].get("status", "")) if runs else ""

    def no_summary(self, run_id: int, how: str) -> FedsimError:
        """The error for a run that ended without its summary or error: one line naming the ServerApp's log."""
        log = self.save_server_log(run_id)
        return FedsimError(f"run {run_id}: {how} without a summary; the ServerApp's log: {log} "
                           f"(its last line: {last_line(log.read_text())!r})")  # fmt: skip

    def save_server_log(self, run_id: int) -> Path:
        """The ServerApp's own output (it runs under the SuperLink), as ``deploy/serverapp.log``."""
        path = self.workdir / "serverapp.log"
        res = self._cli(["log", str(run_id), CONNECTION, "--show"])
        write_file(path, (res.stdout + res.stderr).encode())
        return path

    def stop(self) -> None:
        """Stop every process this deployment started, and every process they started (SIGTERM, then
        SIGKILL after 10 s). A second Ctrl-C meanwhile does not cut this short."""
        with signals_ignored():
            stop_tree({p.pid for p in self.procs.values()})
            for proc in self.procs.values():
                proc.wait()

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the run ------------------------------------------------------------------------------------

    def follow(self, run_id: int, progress: RoundProgress) -> dict[str, Any]:
        """Show progress until the ServerApp writes its summary (or its error)."""
        next_status, next_look = time.monotonic() + STATUS_EVERY_S, time.monotonic() + LOOK_EVERY_S
        serverapp_seen = False
        while True:
            _show(self.run_dir, progress)
            if (result := ended(self.run_dir)) is not None:
                _show(self.run_dir, progress)
                return result
            self._check_superlink()
            if not (self.run_dir / PROGRESS).exists():  # before round 1: a dead SuperNode is a setup error
                for name in self.procs:
                    if name != "superlink" and not self.alive(name):
                        raise FedsimError(f"{name} exited before the first round (log: {self.workdir / name}.log)")
            if time.monotonic() > next_look:
                running = self.serverapp_running()
                # gone, and no summary or error since the check above (a ServerApp writes one, then exits)
                if serverapp_seen and not running and ended(self.run_dir) is None:
                    self._check_superlink(grace=LOOK_EVERY_S)  # its ServerApp goes with a SuperLink killed
                    raise self.no_summary(run_id, "its ServerApp process ended")
                serverapp_seen |= running
                next_look = time.monotonic() + LOOK_EVERY_S
            if time.monotonic() > next_status:
                try:
                    status = self.run_status(run_id)
                except FedsimError:  # the flwr CLI found no SuperLink: say why, if that is why
                    self._check_superlink()
                    raise
                if status.startswith("finished") and ended(self.run_dir) is None:  # as above: neither written since
                    raise self.no_summary(run_id, f"ended as {status}")
                next_status = time.monotonic() + (STATUS_BACKSTOP_S if serverapp_seen else STATUS_EVERY_S)
            time.sleep(0.3)


def last_line(text: str) -> str:
    """The log's last line that says something: an error is one line, and the log holds the rest."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def ended(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary once its ServerApp wrote it, its error (raised) once it wrote that, else None; either
    file that is not what fedsim writes (a FIFO, a huge or a foreign file) is an error naming it."""
    if (run_dir / SUMMARY).exists():
        return read_summary(run_dir)
    if (run_dir / ERROR).exists():
        raise FedsimError(read_error(run_dir))
    return None


def _show(run_dir: Path, progress: RoundProgress) -> None:
    try:
        p = read_progress(run_dir)
    except FedsimError:  # not written yet, or not readable: only the display waits; the summary ends the run
        return
    progress.update(p["round"], p["loss"], p["acc"])


def deploy(cfg: RunConfig, wrap: Wrap | None = None, resume: bool = False) -> dict[str, Any]:
    """Run ``cfg`` on a SuperLink and one SuperNode per client on this host; returns the summary. ``resume``:
    go on from the checkpoint in its run dir (:func:`fedsim.record.checkpoint.resume_config`)."""
    from fedsim.client.vectorized import refusal
    from fedsim.engines.runner import plan

    if why := refusal(cfg, "deploy"):
        raise ConfigError(why)
    check_address(cfg.deploy.address)
    experiment = plan(cfg, resume)  # validates data and split before any process starts
    cfg = experiment.config.model_copy(deep=True)
    cfg.output.run_dir = str(Path(cfg.output.run_dir or "").resolve())
    if private_network.wanted(cfg):  # loopback only: no other local process may reach the SuperLink
        if (why := private_network.unavailable()) is None:
            return private_network.deploy_inside(cfg, resume)
        private_network.warn_exposed(cfg, why)
    show = cfg.output.progress  # shown by this process: the ServerApp under the SuperLink shows nothing
    if show:
        show_partition(experiment.federation())
    with (
        sigterm_as_interrupt(),
        claimed(Path(cfg.output.run_dir), resume),
        LocalDeployment(cfg, wrap, resume) as dep,
    ):
        dep.start()
        run_id = dep.submit()
        progress = RoundProgress(cfg.train.rounds, show)
        try:
            summary = dep.follow(run_id, progress)
        finally:
            progress.stop()
    if show:
        console.print(summary_table(summary))
    return summary
