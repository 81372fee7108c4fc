"""The ``fedsim`` command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import warnings
from typing import Any, NoReturn

# only light modules here: main() takes SIGTERM over before the heavy ones load (pydantic, torch, Ray)
from fedsim.environment import check_libraries_load, check_working_directory, fault_of
from fedsim.errors import DEBUG_ENV, ERROR_FILE_ENV, ChildExit, ConfigError, FedsimError, FedsimWarning
from fedsim.paths import home_expanded
from fedsim.plugin_guard import abandoned_calls, exit_now, plugin_code, warn_stray_threads
from fedsim.processes import sigterm_as_interrupt, sigterm_raised


def _resuming(args: argparse.Namespace) -> bool:
    """Whether ``fedsim run`` / ``deploy`` continues a run (``--resume RUN_DIR``, which takes the place of the
    config file and ``--set``) or starts one from a config file."""
    if args.resume is not None and (args.config is not None or args.set):
        raise ConfigError(
            f"fedsim {args.command} --resume RUN_DIR takes no config file and no --set: RUN_DIR/config.yaml is "
            "the run's"
        )
    if args.resume is None and args.config is None:
        raise ConfigError(
            f"fedsim {args.command} needs a config file, or --resume RUN_DIR to continue a run from its checkpoint"
        )
    return args.resume is not None


def _cmd_run(args: argparse.Namespace) -> int:
    from fedsim.config_file import load_config
    from fedsim.engines import driver_watch
    from fedsim.engines.runner import run
    from fedsim.record.checkpoint import resume_config

    resume = _resuming(args)
    cfg = resume_config(args.resume) if resume else load_config(args.config, args.set)
    if driver_watch.wanted(cfg):
        return driver_watch.run_watched(args.argv)  # the same command, as a driver this process speaks for
    print(run(cfg, resume=resume)["run_dir"])
    return 0


def _cmd_deploy(args: argparse.Namespace) -> int:
    from fedsim.config_file import load_config
    from fedsim.deploy import private_network
    from fedsim.deploy.launcher import deploy
    from fedsim.record.checkpoint import resume_config

    resume = _resuming(args)
    if private_network.inside():  # the launcher outside (fedsim.deploy.private_network) planned it: on stdin
        cfg = private_network.received_config()
    else:
        cfg = resume_config(args.resume) if resume else load_config(args.config, args.set)
    summary = deploy(cfg, resume=resume)
    print(summary["run_dir"])
    return 0


def _cmd_compose(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fedsim.config_file import load_config
    from fedsim.deploy.compose import write_compose

    cfg = load_config(args.config, args.set)
    out = Path(args.out or f"compose-{cfg.name}")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, not a directory")
    print(write_compose(cfg, out, args.nodes, args.superlink_host, args.node_memory, args.tls_host))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from fedsim.app.plugins import ALL_REGISTRIES, describe

    kinds = list(ALL_REGISTRIES) if args.kind is None else [args.kind]
    for kind in kinds:
        if kind not in ALL_REGISTRIES:
            raise FedsimError(f"unknown kind {kind!r}; valid: {', '.join(ALL_REGISTRIES)}")
        print(describe(kind))
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from fedsim.app import api
    from fedsim.sweep.execute import CellsFailed

    try:
        sweep = api.run_sweep(args.sweep, args.set, args.parallel, args.output)
    except CellsFailed as err:  # a valid sweep that ran, some of whose cells failed: 1, not bad input's 2
        print(f"fedsim: error: {err}", file=sys.stderr)
        return 1
    print(sweep.dir)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from fedsim.app.report import unfinished, write_report

    if not 0 < args.target <= 1:  # NaN fails this too
        raise ConfigError(f"--target {args.target}: give a client-mean accuracy in (0, 1], e.g. 0.5")
    print(write_report(args.dir, args.target, args.vs, args.out).read_text(), end="")
    for run in unfinished(args.dir):
        print(f"fedsim: skipped {run}: not finished (no summary.json)", file=sys.stderr)
    return 0


def _cmd_record_upgrade(args: argparse.Namespace) -> int:
    from fedsim.record.paths import run_dirs, runs_root
    from fedsim.record.upgrade import upgrade_run

    for path in args.dirs:
        for run_dir in run_dirs(runs_root(path, "fedsim record upgrade")):
            print(upgrade_run(run_dir))
    return 0


def _cmd_local(args: argparse.Namespace) -> int:
    from fedsim.app.local import continue_locally

    print(continue_locally(args.run_dir, args.client, args.steps, args.every, args.set))
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from fedsim.app.plots import parse_references, write_plots

    references = parse_references(args.reference)
    out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else ".")
    written, notes = write_plots(args.run_dirs, out, args.mean_over_seeds, args.log_rounds, references)
    for path in written:
        print(path)
    for note in notes:
        print(f"fedsim: skipped {note}", file=sys.stderr)
    return 0


class _StoreOnce(argparse._StoreAction):
    """argparse's ``store``, refusing an option given twice: argparse would keep the last value silently
    (``--target 0.5 --target 0.9``, ``--out a --out b``), a value the user typed lost without a word."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        given = namespace.__dict__.setdefault("_given", {})
        if option_string is not None and self.dest in given:
            raise argparse.ArgumentError(self, f"given twice ({given[self.dest]}, then {values}): give it once")
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


def _path(value: str) -> str:
    """A path argument, ``~`` expanded as in every path fedsim takes (:func:`fedsim.paths.home_expanded`); an
    empty one (an unset shell variable) is refused rather than read as the current directory."""
    if not value:
        raise argparse.ArgumentTypeError("an empty path: give a file or directory (. for the current directory)")
    return home_expanded(value)


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported as fedsim reports every error: one line, status 2; an option
    that takes one value may be given once (:class:`_StoreOnce`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def error(self, message: str) -> NoReturn:
        # also what argparse says of a value it took for an option (--node-memory -4g): how to give one
        if option := re.fullmatch(r"argument (-[^/:]+)\S*: expected one argument", message):
            message += f"; a value that starts with '-' is written {option[1]}=VALUE"
        self.exit(2, f"fedsim: error: {self.prog.removeprefix('fedsim ')}: {message} (see {self.prog} --help)\n")


def _add_overrides(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY=VALUE ...``; given twice, the lists add up (``--set a=1 --set b=2`` sets both)."""
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help=help)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedsim", description="Federated learning on label-skewed data.")
    parser.add_argument(
        "--debug", action="store_true",
        help=f"a plugin's exception with its traceback, in this process and those it starts ({DEBUG_ENV}=1)",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run one experiment from a YAML config")
    run.add_argument("config", nargs="?", type=_path, help="path to the YAML config")
    _add_overrides(run, "override config values, e.g. train.rounds=5")
    run.add_argument(
        "--resume",
        type=_path,
        metavar="RUN_DIR",
        default=None,
        help="continue an interrupted run from its last checkpoint (output.checkpoint_every), to the same result",
    )
    run.set_defaults(func=_cmd_run)
    dep = sub.add_parser(
        "deploy", help="run one experiment on a real Flower SuperLink + one SuperNode per client, on this host"
    )
    dep.add_argument(
        "config", nargs="?", type=_path, help="path to the YAML config (its deploy: section: address, port, tls, auth)"
    )
    _add_overrides(dep, "override config values")
    dep.add_argument(
        "--resume",
        type=_path,
        metavar="RUN_DIR",
        default=None,
        help="continue a deployed run whose SuperLink, ServerApp or launcher was killed, from its last checkpoint",
    )
    dep.set_defaults(func=_cmd_deploy)
    comp = sub.add_parser("compose", help="write a Docker Compose project: SuperLink, N SuperNodes, submit")
    comp.add_argument("config", type=_path, help="path to the YAML config")
    comp.add_argument("--nodes", type=int, default=None, help="SuperNodes (= train.num_clients; default the config's)")
    comp.add_argument("--out", type=_path, default=None, help="the project directory (default compose-<name>)")
    comp.add_argument(
        "--superlink-host", default="superlink", help="how SuperNodes reach the SuperLink (a host name across hosts)"
    )
    comp.add_argument("--node-memory", default=None, help="memory limit per SuperNode, e.g. 4g")
    comp.add_argument(
        "--tls-host", nargs="+", action="extend", default=[], help="extra names for the generated TLS certificate"
    )
    _add_overrides(comp, "override config values")
    comp.set_defaults(func=_cmd_compose)
    sweep = sub.add_parser("sweep", help="run every cell of a sweep file (skips finished runs)")
    sweep.add_argument("sweep", type=_path, help="path to the sweep YAML")
    sweep.add_argument("--parallel", type=int, default=None, help="runs at once (default: the file's)")
    _add_overrides(
        sweep, "override every cell after the file's `set`, e.g. a short budget: train.rounds=20 eval.every=10"
    )
    sweep.add_argument(
        "--output",
        type=_path,
        default=None,
        metavar="DIR",
        help="parent of the sweep directory (default: the file's output)",
    )
    sweep.set_defaults(func=_cmd_sweep)
    report = sub.add_parser("report", help="results table (Markdown, CSV) and accuracy plot of a sweep")
    report.add_argument("dir", type=_path, help="a sweep directory (or any directory holding run directories)")
    report.add_argument("--target", type=float, default=0.5, help="accuracy for 'rounds to target'")
    report.add_argument(
        "--out",
        "-o",
        type=_path,
        default=None,
        help="where the report goes (default: DIR; a new directory or one of fedsim's)",
    )
    report.add_argument(
        "--vs", metavar="KEY", default=None,
        help="also plot final accuracy against this config key (e.g. partition.beta): final_vs_<key>.png",
    )  # fmt: skip
    report.set_defaults(func=_cmd_report)
    record = sub.add_parser("record", help="run directories' records: upgrade an older one to this fedsim's")
    record_sub = record.add_subparsers(dest="record_command", required=True, parser_class=_Parser)
    upgrade = record_sub.add_parser(
        "upgrade", help="check an older run record's checksums once and rewrite it of this fedsim's record version"
    )
    upgrade.add_argument(
        "dirs", nargs="+", type=_path, metavar="DIR", help="run directories (or directories holding them)"
    )
    upgrade.set_defaults(func=_cmd_record_upgrade)
    plot = sub.add_parser("plot", help="PNGs of runs: accuracy per round, label distribution, feature spectrum")
    plot.add_argument(
        "run_dirs", nargs="+", type=_path, metavar="RUN_DIR", help="run directories (or directories holding them)"
    )
    plot.add_argument(
        "--out", "-o", type=_path, default=None,
        help="where the PNGs go: a new directory or one of fedsim's (default: the RUN_DIR if one, else the current "
        "directory)",
    )  # fmt: skip
    plot.add_argument(
        "--mean-over-seeds", action="store_true",
        help="accuracy.png: runs that differ only in their seed as one line, the mean, shaded ± sample std",
    )  # fmt: skip
    plot.add_argument("--log-rounds", action="store_true", help="rounds on a log scale (accuracy, effective rank)")
    plot.add_argument(
        "--reference", action="append", default=[], metavar="NAME=PERCENT",
        help='accuracy.png: mark an accuracy, e.g. --reference "LN-FL FedLN=78.04" (repeatable)',
    )  # fmt: skip
    plot.set_defaults(func=_cmd_plot)
    local = sub.add_parser(
        "local",
        help="continue one client of a finished run alone (LN-FL Figs. 2-3): accuracy on its own and on the "
        "other classes, feature diagnostics, into RUN_DIR/local-<k>/",
    )
    local.add_argument("run_dir", type=_path, metavar="RUN_DIR", help="a finished run (its config.yaml and model.pt)")
    local.add_argument("--client", type=int, required=True, metavar="K", help="the client (partition id) to train")
    local.add_argument("--steps", type=int, required=True, metavar="S", help="local SGD steps to take")
    local.add_argument("--every", type=int, default=1, metavar="E", help="evaluate every E steps (default 1)")
    _add_overrides(
        local, "change the run's config for the local training, e.g. model.norm=fn (LN-FL Fig. 2) or train.lr=0.1"
    )
    local.set_defaults(func=_cmd_local)
    lst = sub.add_parser("list", help="list strategies, normalisers, models, datasets, partitioners")
    lst.add_argument("kind", nargs="?", help="one kind only")
    lst.set_defaults(func=_cmd_list)
    return parser


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """fedsim's own warnings (deprecated config forms, evaluations missing from a run's metrics) as one plain
    line; others as Python shows them."""
    if issubclass(category, FedsimWarning):
        print(f"fedsim: warning: {message}", file=sys.stderr)
    else:
        _python_show_warning(message, category, *args, **kwargs)


_python_show_warning = warnings.showwarning


def _record_error(err: FedsimError) -> None:
    """The error's type and message into the file ``FEDSIM_ERROR_FILE`` names (set by ``fedsim sweep`` for each
    cell's process), which this process makes: a path that exists already (a directory, a symlink, someone's
    file) is left alone, as is one that cannot be made; the error line on stderr has said why all the same,
    and the sweep reads that instead."""
    if not (path := os.environ.get(ERROR_FILE_ENV)):
        return
    try:
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as file:
            file.write(json.dumps({"type": type(err).__name__, "message": str(err)}))
    except OSError:  # exists, or cannot be made or written (a full disk): the sweep falls back on the log
        return


def _stop(err: FedsimError) -> int:
    """The error as fedsim's one line, recorded for a sweep; status 2."""
    print(f"fedsim: error: {err}", file=sys.stderr)
    _record_error(err)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The ``fedsim`` command: its exit status is 0, 2 for bad input or a fault of the environment (one line on
    stderr, :mod:`fedsim.environment`), 1 for a sweep some of whose cells failed, 130 on Ctrl-C and 143 on SIGTERM
    (one line each, every process the command started stopped). Threads that plugin code left running are named in
    a warning, and the process ends with that status without waiting for them (Python's own exit would wait
    forever); so it does when a bounded call it gave up on still runs (Python's own exit could abort in it)."""
    before = set(threading.enumerate())
    code = _command(argv)
    if warn_stray_threads(before) or abandoned_calls():
        exit_now(code)
    return code


def _command(argv: list[str] | None) -> int:
    try:
        with sigterm_as_interrupt():  # from the first moment: start-up included, every engine after it
            args = build_parser().parse_args(argv)
            args.argv = sys.argv[1:] if argv is None else list(argv)
            check_working_directory()  # before torch loads: its libraries fail to, without one
            check_libraries_load()
            if getattr(args, "set", None):  # every command's --set
                from fedsim.config_file import check_keys_once

                check_keys_once(args.set)
            if args.debug:
                os.environ[DEBUG_ENV] = "1"
            warnings.showwarning = _show_warning
            with plugin_code():  # a plugin's sys.exit / os._exit in any command is a PluginExit (fedsim.plugin_guard)
                return args.func(args)
    except ChildExit as err:  # the fedsim process it ran has said why
        return err.code
    except BrokenPipeError:  # its output went to a reader that stopped reading (fedsim list | head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that Python's exit flush is quiet
        return 128 + signal.SIGPIPE
    except FedsimError as err:
        return _stop(err)
    except (ImportError, MemoryError) as err:  # a library that does not load, memory run out: the environment's
        return _stop(fault_of(err))
    except KeyboardInterrupt as err:  # SIGTERM's Terminated too, which code in between may have made a plain one
        sig = signal.SIGTERM if sigterm_raised() else signal.SIGINT
        how = "interrupted by SIGTERM" if sig == signal.SIGTERM else "interrupted"
        # a run stopped in its run directory notes where its metrics are (runner.run); before it, none exist
        print("; ".join([f"fedsim: {how}", *getattr(err, "__notes__", [])]), file=sys.stderr)
        return 128 + sig


if __name__ == "__main__":
    sys.exit(main())
