"""Checksums of what fedsim writes and later reads back (checkpoints, the final model), so that a file
that changed on disk after fedsim wrote it is refused instead of trained on or continued from.

:func:`digest` is a SHA-256 over a canonical encoding of the value, not of the file's bytes: it is the
same for the same tensors and fields however ``torch.save`` lays them out, and it covers every byte
of every tensor (a flipped bit in a weight, which ``torch.load`` reads without complaint, changes it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from fedsim.errors import FedsimError
from fedsim.reading import GIB, check_file


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"tensor:{t.dtype}:{tuple(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's own bytes, not a copy
    elif isinstance(value, dict):
        h.update(f"dict:{len(value)}:".encode())
        for key in sorted(value, key=str):
            _feed(h, str(key))
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"list:{len(value)}:".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, str):
        data = value.encode()
        h.update(f"str:{len(data)}:".encode() + data)
    elif value is None or isinstance(value, (bool, int, float)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        raise TypeError(f"no canonical encoding for {type(value).__name__}")


def digest(value: Any) -> str:
    """SHA-256 (hex) of ``value``: nested dicts, lists and tuples of tensors, strings, numbers, None."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


TORCH_BYTES = 64 * GIB  # a checkpoint or model fedsim wrote: far above any the paper's models make


def read_torch(path: Path, what: str) -> Any:
    """``torch.load`` of a file fedsim wrote (tensors and plain types only); a truncated or foreign file
    is one line naming it and ``what`` it should be, not a pickle traceback; a FIFO or a device is refused
    unread (torch.load would wait on it forever)."""
    if path.exists():  # a missing file stays FileNotFoundError: its callers say which run lacks it
        check_file(path, what, TORCH_BYTES, FedsimError)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 (whatever torch's readers raise on bytes that are not theirs)
        first = (str(err).strip().splitlines() or [""])[0]
        raise FedsimError(f"{path}: not a readable {what} ({type(err).__name__}: {first})") from err


def verify(path: Path, value: Any, expected: object) -> None:
    """Refuse ``value`` read from ``path`` unless its digest is ``expected`` (what fedsim wrote with it)."""
    if not isinstance(expected, str):
        raise FedsimError(f"{path}: no checksum to check it against (written by a fedsim without checksums, "
                          "or not by fedsim): refused")  # fmt: skip
    if digest(value) != expected:
        raise FedsimError(f"{path}: its contents do not match the checksum fedsim wrote with them (the file "
                          "changed on disk after it was written): refused")  # fmt: skip
