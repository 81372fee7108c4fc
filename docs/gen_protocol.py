"""``docs/protocol.md``, generated: the core's protocol (``fedsim/wire.py``) and each built-in strategy's own rows
(its ``StrategySpec.protocol``, in its file under ``strategies/``).

``python docs/gen_protocol.py > docs/protocol.md`` writes it; ``tests/test_architecture.py`` checks that the file
is what this prints. Installed plugin strategies are not listed: the document describes fedsim, not the
machine it was generated on.
"""

from __future__ import annotations

from fedsim import wire
from fedsim.strategies import STRATEGIES


def builtin_protocols() -> dict[str, tuple[str, tuple[wire.Key, ...]]]:
    """Each built-in strategy's registered name -> its summary and its protocol rows."""
    return {entry.name: (entry.summary, entry.obj.protocol) for entry in STRATEGIES.builtins()}


def protocol_document() -> str:
    return wire.protocol_markdown(builtin_protocols())


if __name__ == "__main__":
    print(protocol_document(), end="")
