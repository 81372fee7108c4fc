"""When a run evaluates: what the server decides each round and what a run's metrics.jsonl is checked against
(a line at a round the run did not evaluate is not its own)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EvalCadence:
    """Evaluate every ``every`` rounds and after the last one."""

    every: int
    num_rounds: int

    def is_eval_round(self, server_round: int) -> bool:
        return server_round % self.every == 0 or server_round == self.num_rounds
