"""``python -m tests.sigkill_at_round ROUND fedsim-args...``: the fedsim command line, whose process SIGKILLs
itself when the round loop reports round ROUND (after every earlier round's metrics line and checkpoint,
before ROUND's). A kill at an exact round, on any machine however slow or loaded, where a watcher that
polls the run directory races the run (tests/test_resume.py). The server's round loop runs in this process
under every engine (inline, the Ray pool's driver, Flower's simulation), so the whole run dies as under an
outside SIGKILL: no handler, no cleanup."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from fedsim.app.cli import main
from fedsim.server.reporter import RoundReporter


def sigkill_at(kill_round: int) -> None:
    report = RoundReporter.round_done

    def round_done(self: RoundReporter, server_round: int, *facts: Any) -> None:
        if server_round == kill_round:
            os.kill(os.getpid(), signal.SIGKILL)
        report(self, server_round, *facts)

    RoundReporter.round_done = round_done  # type: ignore[method-assign]


if __name__ == "__main__":
    sigkill_at(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
