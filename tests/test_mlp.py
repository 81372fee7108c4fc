"""The MLP (fedsim/models/mlp.py): its parameter counts."""

from __future__ import annotations

import pytest

from tests.model_support import MNIST, build, n_params

pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


def test_mlp_param_count() -> None:
    assert n_params(build("mlp", "none")) == 3072 * 200 + 200 * 200 + 200 * 10
    assert n_params(build("mlp", "ln", in_shape=MNIST, hidden=[50])) == 784 * 50 + 2 * 50 + 50 * 10
