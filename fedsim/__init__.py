"""fedsim: federated learning on label-skewed data, on Flower.

From Python::

    import fedsim

    result = fedsim.run("configs/quickstart.yaml", ["train.rounds=5"])
    result.summary["final_client_mean_acc"], result.metrics

:mod:`fedsim.app.api` has the whole public API; its names are imported here on first use, so that
``import fedsim`` (and every ``fedsim`` command, which imports this package) stays instant.
"""

from __future__ import annotations

from typing import Any

from fedsim.errors import FedsimError

_API = ("Run", "Sweep", "make_config", "open_run", "open_sweep", "resume", "run", "run_sweep")
__all__ = ["FedsimError", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from fedsim.app import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedsim' has no attribute {name!r}")
