"""When a run evaluates: what the server decides each round and what a run's metrics.jsonl is checked against
(a line at a round the run did not evaluate is not its own), and which evaluations score the personalised models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedsim.config import RunConfig


@dataclass(frozen=True)
class EvalCadence:
    """Evaluate every ``every`` rounds and after the last one."""

    every: int
    num_rounds: int

    def is_eval_round(self, server_round: int) -> bool:
        return server_round % self.every == 0 or server_round == self.num_rounds


def personalises(cfg: RunConfig, server_round: int) -> bool:
    """Whether the evaluation of ``server_round`` scores the personalised models too (``eval.personal`` on: at every
    evaluation, or every ``eval.personal.every`` rounds and after the last)."""
    personal = cfg.eval.personal
    if personal.steps is None:
        return False
    return EvalCadence(personal.every or cfg.eval.every, cfg.train.rounds).is_eval_round(server_round)
