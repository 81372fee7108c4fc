"""FedBABU (Oh, Kim, Yun, ICLR 2022) against the paper's Algorithm 1, written here from the paper and the authors'
code.

The reference never calls fedsim's strategy: each client is a deepcopy of the model trained by
``torch.optim.SGD`` with the authors' two parameter groups (the body at the learning rate, the head at 0), with
momentum and weight decay on; the server is θ_ext = Σ n_i/n·θ_ext,i in float64 with the head left at θ_cls^0.
fedsim's clients train through the one training loop (``train_local``) with the strategy's hooks, and its
server half runs through the harness of tests/strategy_harness.py (fedsim's ``LocalGrid``).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Message, RecordDict

from fedsim.app.cli import main
from fedsim.arrays import to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, train_local
from fedsim.config_file import parse_config
from fedsim.data.batches import BatchStream
from fedsim.engines.local import LocalGrid
from fedsim.engines.runner import run
from fedsim.experiment.resolve import resolve
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm
from fedsim.strategies.hooks import RoundInfo
from tests import strategy_rows
from tests.conftest import small_config, write_config
from tests.strategy_harness import Clients, client_round, numpy_of, play_round, reply, server, spec
from tests.test_resume import check_resume, metrics

LR, MOMENTUM, WD, STEPS, BATCH, CLASSES, SHAPE = 0.1, 0.9, 0.01, 3, 4, 3, (1, 4, 4)
SIZES = {0: 12, 1: 8, 2: 4}  # unequal n_i: the paper's n_i/n weights differ from the authors' uniform mean


def model() -> FedsimModel:
    torch.manual_seed(0)
    return create_model("mlp", CLASSES, SHAPE, create_norm("ln"), {"hidden": [6, 5]})


def data(pid: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + pid)
    x = torch.randint(0, 256, (SIZES[pid], *SHAPE), dtype=torch.uint8, generator=g)
    return x, torch.randint(0, CLASSES, (SIZES[pid],), generator=g)


def stream(pid: int, server_round: int) -> BatchStream:
    x, y = data(pid)
    return BatchStream(x, y, BATCH, torch.Generator().manual_seed(10 * server_round + pid))


def is_head(key: str) -> bool:
    """The authors' split: the head is the last linear layer (theirs is named ``linear``, fedsim's ``classifier``)."""
    return key.startswith("classifier.")


def reference_client(net: FedsimModel, weights: dict[str, torch.Tensor], pid: int, server_round: int):  # type: ignore[no-untyped-def]
    """ClientBodyUpdate (Algorithm 1) as the authors' code runs it: SGD with the body's parameters at
    the learning rate and the head's at 0, momentum and weight decay on, plain cross-entropy."""
    w = copy.deepcopy(net)
    w.load_state_dict(weights)
    w.train()
    body = [p for k, p in w.named_parameters() if not is_head(k)]
    head = [p for k, p in w.named_parameters() if is_head(k)]
    sgd = torch.optim.SGD([{"params": body, "lr": LR}, {"params": head, "lr": 0.0}], momentum=MOMENTUM, weight_decay=WD)
    for x, y in stream(pid, server_round).batches(STEPS):
        sgd.zero_grad()
        F.cross_entropy(w(x), y).backward()
        sgd.step()
    return {k: v.detach().clone() for k, v in w.state_dict().items()}


def reference_round(net: FedsimModel, weights: dict[str, torch.Tensor], server_round: int):  # type: ignore[no-untyped-def]
    """One round of Algorithm 1: every client's update, then θ_ext = Σ n_i/n·θ_ext,i in float64, the head kept
    at θ_cls^0; also the authors' uniform mean of the body, to show the weights matter."""
    trained = {pid: reference_client(net, weights, pid, server_round) for pid in SIZES}
    n = sum(SIZES.values())
    new, uniform = {}, {}
    for k, v in weights.items():
        if is_head(k):
            new[k] = v.double().numpy()
            continue
        new[k] = sum(SIZES[pid] / n * trained[pid][k].double().numpy() for pid in SIZES)
        uniform[k] = sum(trained[pid][k].double().numpy() for pid in SIZES) / len(SIZES)
    return trained, new, uniform


def fedsim_round(net: FedsimModel, weights: dict[str, torch.Tensor], server_round: int):  # type: ignore[no-untyped-def]
    """One round of fedsim's FedBABU: its client hooks around ``train_local``, its server half on the replies;
    each client's model after training and reply, and the new global model."""
    hooks = spec("fedbabu").client()
    after: dict[int, tuple[dict[str, torch.Tensor], set[str]]] = {}

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        info = RoundInfo(server_round, pid, STEPS, None, LR, MOMENTUM, torch.ones(CLASSES))
        sent, extra = client_round(net, hooks, msg, state, info, stream(pid, server_round), WD)
        after[pid] = ({k: v.detach().clone() for k, v in net.state_dict().items()}, set(sent))
        return reply(sent, pid, SIZES[pid], extra)

    strategy = server("fedbabu", len(SIZES), {k for k, _ in net.named_parameters()})
    arrays = play_round(strategy, LocalGrid(Clients(client, len(SIZES))), server_round, to_array_record(weights))
    return after, numpy_of(arrays)


def test_two_rounds_match_algorithm_1_with_the_head_at_its_initialisation() -> None:
    net = model()
    x0 = {k: v.detach().clone() for k, v in net.state_dict().items()}
    weights = x0
    for server_round in (1, 2):
        ref_clients, ref_global, uniform = reference_round(net, weights, server_round)
        clients, got = fedsim_round(net, weights, server_round)
        assert got.keys() == ref_global.keys() == x0.keys()
        for pid, (trained, sent) in clients.items():
            assert sent == {k for k in x0 if not is_head(k)}  # the head never leaves the client
            for k, v in trained.items():
                # the same SGD update (torch.optim.SGD and LocalSgd call one function) on the same batches: the
                # body equal to float32 rounding of a reordered sum, the head unmoved by momentum or weight decay
                if is_head(k):
                    assert torch.equal(v, x0[k]), (pid, k)
                else:
                    torch.testing.assert_close(v, ref_clients[pid][k], rtol=1e-6, atol=1e-7, msg=(pid, k))
        for k, v in got.items():
            if is_head(k):
                assert np.array_equal(v, x0[k].double().numpy()), k  # θ_cls^0, bit for bit
            else:
                # float32 weighted sum of three terms against float64: within a few ulps of |θ| <= ~1
                np.testing.assert_allclose(v, ref_global[k], rtol=1e-6, atol=1e-6, err_msg=k)
        # the body moved, and the paper's n_i/n weights matter (the authors' uniform mean is elsewhere)
        assert max(np.abs(got[k] - weights[k].double().numpy()).max() for k in uniform) > 1e-2
        assert max(np.abs(got[k] - uniform[k]).max() for k in uniform) > 1e-4
        weights = {k: torch.from_numpy(v).float() for k, v in got.items()}


def test_without_the_hooks_momentum_and_weight_decay_would_move_the_head() -> None:
    # the check above could not fail if the head took no gradient anyway: under FedAvg's hooks it moves
    net, fedavg = model(), spec("fedavg").client()
    head = {k: v.clone() for k, v in net.classifier.state_dict().items()}
    info = RoundInfo(1, 0, STEPS, None, LR, MOMENTUM, torch.ones(CLASSES))
    train_local([ClientRound(net, fedavg, stream(0, 1), info)], LocalSgd(net.parameters(), LR, MOMENTUM, WD))
    assert all(not torch.equal(v, head[k]) for k, v in net.classifier.state_dict().items())


def run_dir_of(tmp_path: Path, **sections: object) -> tuple[Path, list[dict[str, object]]]:
    summary = run(parse_config(small_config(tmp_path, **sections)))
    return Path(summary["run_dir"]), metrics(Path(summary["run_dir"]))


def test_a_run_keeps_the_initial_head_and_personalises_by_fine_tuning(tmp_path: Path, one_thread: None) -> None:
    sections = {**strategy_rows.sections("fedbabu"), "eval": {"every": 2, "personal": {"steps": 5}}}
    run_dir, lines = run_dir_of(tmp_path, **sections)
    initial = resolve(parse_config(small_config(tmp_path, **sections))).initial_model().state_dict()
    final = torch.load(run_dir / "model.pt", weights_only=True)
    for k, v in final.items():
        assert torch.equal(v, initial[k]) if is_head(k) else not torch.equal(v, initial[k]), k
    assert lines[-1]["client_mean_acc"] > 0.3  # the body learned under a random head: 10 classes
    assert lines[-1]["personal_acc"] != lines[-1]["client_mean_acc"]  # the fine-tuning moved the scores


@pytest.mark.slow
def test_a_killed_fedbabu_run_resumes_to_the_uninterrupted_one(tmp_path: Path) -> None:
    sections = strategy_rows.sections("fedbabu")
    train = {**sections.pop("train"), "clients_per_round": 2}
    check_resume(tmp_path, stateful=False, train=train, **sections)


def test_an_option_is_refused_in_one_line_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["run", str(write_config(tmp_path, small_config(tmp_path))), "--set", "strategy={name: fedbabu, lr: 0}"]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fedsim: error: "), lines
    assert "strategy.lr" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()
