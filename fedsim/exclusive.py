"""One fedsim run, sweep or ``fedsim local`` at a time in a process.

A run sets what belongs to the whole process, not to a thread: torch's global random state (seeded per
round, forked to build a model), its intra-op thread count, Flower's task identity. Two runs in two threads of
one process would each change the other's numbers without a word, so the second is refused at once, before it
reads or writes anything. The thread that holds the claim may enter again: a sweep runs its cells in its own
thread, one after the other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fedsim.errors import FedsimError

_claim = threading.RLock()
_holder = ""  # what holds the claim, for the message of the one refused


@contextmanager
def claim_process(what: str) -> Iterator[None]:
    """This process for ``what`` (``a run``, ``a sweep``, ``fedsim local``) while the block runs (usable as a
    decorator); an error at once if another thread's run, sweep or ``fedsim local`` holds it."""
    global _holder
    if not _claim.acquire(blocking=False):
        raise FedsimError(
            f"cannot start {what}: this process is running {_holder} already; fedsim runs one run, sweep or "
            "fedsim local at a time per process (torch's random state and thread count are the whole process's, "
            "so two at once would change each other's numbers): run several at once as separate processes, e.g. "
            "`fedsim sweep --parallel N` or one `fedsim run` each"
        )
    outer = _holder
    _holder = outer or f"{what} (in thread {threading.current_thread().name!r})"
    try:
        yield
    finally:
        _holder = outer
        _claim.release()
