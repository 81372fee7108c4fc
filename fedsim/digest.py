"""A SHA-256 of a value rather than of a file's bytes (:func:`digest`): the same for the same tensors and fields
however they are stored, and covering every byte of every tensor. The data's fingerprint is one
(:mod:`fedsim.data.fingerprint`); so were the checksums of record version 1, which ``fedsim record upgrade``
checks (:mod:`fedsim.record.legacy`)."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


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
