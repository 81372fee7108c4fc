"""The bound on a model's size (fedsim/models/size.py): what it counts on the meta device."""

from __future__ import annotations

import pytest

from fedsim.models.size import counted
from fedsim.norms import list_norms
from tests.model_support import BUILTIN_MODELS, build

pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


@pytest.mark.parametrize("model_name", BUILTIN_MODELS)
def test_the_size_check_counts_on_the_meta_device_what_the_model_allocates(model_name: str) -> None:
    """fedsim.models.size counts a model without its storage: the same elements and bytes, parameters and
    buffers (BN's running statistics) alike, as the model built for real, for every built-in normaliser."""
    for norm in list_norms():
        real = build(model_name, norm)
        tensors = [*real.parameters(), *real.buffers()]
        expected = (sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors))
        assert counted(lambda norm=norm: build(model_name, norm)) == expected, norm
