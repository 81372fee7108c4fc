"""``flower-superexec`` as a SuperNode started by ``fedsim-supernode`` runs it: Flower's own SuperExec,
whose wait between looks for a task ends when its SuperNode rings the node's doorbell
(:func:`fedsim.deploy.flower_waits.wake_on_doorbell`), named by ``FEDSIM_DOORBELL``. Without one it is
Flower's SuperExec unchanged.
"""

from __future__ import annotations

import os
import sys

from fedsim.deploy import flower_waits

DOORBELL_ENV = "FEDSIM_DOORBELL"


def main() -> None:
    if path := os.environ.get(DOORBELL_ENV):
        flower_waits.wake_on_doorbell(flower_waits.Doorbell(path))
    from flwr.supercore.cli.flower_superexec import flower_superexec

    sys.argv = ["flower-superexec", *sys.argv[1:]]
    flower_superexec()


if __name__ == "__main__":
    main()
