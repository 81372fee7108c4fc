"""A strategy's client half (strategies/hooks.py): the defaults are FedAvg's, and each default is what a strategy
that overrides only part of them gets. Every built-in strategy's hooks against its paper: tests/test_<strategy>.py."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, RecordDict

from fedsim.arrays import array_view, dump_arrays
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from tests.strategy_harness import mlp

INFO = RoundInfo(1, 0, 3, None, 0.1, 0.0, torch.tensor([1, 2, 3]))


def test_the_model_goes_out_and_comes_back_whole_buffers_included() -> None:
    torch.manual_seed(0)
    sender, receiver, hooks = mlp("bn"), mlp("bn"), ClientHooks(None)
    sender.train()
    sender(torch.rand(4, 1, 2, 2))  # BN's running statistics move: buffers that must travel too
    sent = hooks.reply_arrays(sender, RecordDict())
    assert set(sent) == set(sender.state_dict())
    hooks.load_global(receiver, sent, RecordDict())
    assert all(torch.equal(v, sender.state_dict()[k]) for k, v in receiver.state_dict().items())
    assert {k: array_view(a).tobytes() for k, a in sent.items()} == {
        k: array_view(a).tobytes() for k, a in dump_arrays(receiver).items()
    }


def test_the_training_hooks_change_nothing_by_default() -> None:
    hooks, model = ClientHooks(None), mlp()
    logits = torch.randn(5, 3)
    assert hooks.adjust_logits(logits, INFO) is logits
    assert hooks.extra_loss(model, torch.zeros(5), torch.zeros(5, 4), logits, torch.zeros(5, dtype=torch.long)) is None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hooks.begin_round(model, RecordDict(), RecordDict(), INFO)
    hooks.correct_gradients(model)
    assert len(hooks.end_round(model, RecordDict(), INFO, 3)) == 0  # nothing beside the model in the reply
    assert hooks.own_parameters(model) == []
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


class KeepsItsOwnClassifier(ClientHooks):
    """A client that keeps its classifier out of what it loads (as FedBN keeps its norms)."""

    def load_global(self, model, arrays: ArrayRecord, state: RecordDict) -> None:  # type: ignore[no-untyped-def]
        kept = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("classifier.")}
        super().load_global(model, arrays, state)
        model.load_state_dict(kept, strict=False)


def test_a_client_is_scored_with_the_model_it_would_train_from_and_personalised_by_fine_tuning() -> None:
    torch.manual_seed(0)
    server_model, client_model, hooks = mlp(), mlp(), KeepsItsOwnClassifier(None)
    arrays = dump_arrays(server_model)
    hooks.load_for_eval(client_model, arrays, RecordDict())  # load_for_eval defaults to load_global: overridden too
    for k, v in client_model.state_dict().items():
        assert torch.equal(v, server_model.state_dict()[k]) != k.startswith("classifier."), k
    tuned: list[torch.nn.Module] = []
    assert hooks.personalize(client_model, RecordDict(), tuned.append) is client_model  # type: ignore[arg-type]
    assert tuned == [client_model]  # the generic fine-tuning, on the copy it is given
