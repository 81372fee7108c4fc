"""What fedsim says of a Ray worker lost in a round, the same under the Ray pool and Flower's runtime.

A worker's process that ends mid-round (SIGKILL, the OOM killer, Ray's memory monitor, ``os._exit`` in a
client's code) surfaces as a Ray error of many lines: the actor's ids, its namespace and address, Ray's cause,
then advice. Each client it was serving gets an error reply instead, whose reason keeps Ray's cause alone,
in one line; the round loop names the round and the clients and applies ``train.on_client_failure``.
"""

from __future__ import annotations

import re

from ray.exceptions import RayError, RayTaskError

# Ray's errors for a worker whose process is gone (not one whose code raised: RayTaskError)
GONE = ("ActorDiedError", "ActorUnavailableError", "RayActorError", "WorkerCrashedError", "OutOfMemoryError",
        "NodeDiedError", "LocalRayletDiedError")  # fmt: skip


def ray_cause(kind: str, text: str) -> str:
    """``kind: cause`` in one line, the cause in Ray's own words without the ids and advice around them."""
    words = re.sub(r"The actor [0-9a-f]{16,} ", "The actor ", " ".join(text.split()))
    _, dead, because = words.partition("The actor is dead because ")
    return f"{kind}: {(because if dead else words).split(' Some common causes include')[0]}"


def worker_died(kind: str, text: str, node: str | None = None) -> str:
    """The reason a client's message failed when Ray says its worker is gone; ``node``: where the worker ran
    (its node's address and id, as ``workers.jsonl`` names them), when known."""
    on = f" on node {node}" if node else ""
    return f"their Ray worker{on} died during the round ({ray_cause(kind, text)})"


def how_lost(err: RayError, node: str | None = None) -> str:
    """How a worker (on ``node``, when known) came to bring no replies: died (Ray's words), or raised outside the
    ClientApp."""
    if isinstance(err, RayTaskError):
        cause = err.cause if isinstance(err.cause, BaseException) else err
        return " ".join(f"their Ray worker raised {type(cause).__name__}: {cause}".split())
    return worker_died(type(err).__name__, str(err), node)
