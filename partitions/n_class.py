"""Pathological label skew "#C=k": every client holds exactly k distinct classes.

``assign: random`` (the default) draws the classes as LN-FL's released code does
(``data/preprocess_vision.py``, ``generate_part``; NIID-Bench and Flower Datasets'
``PathologicalPartitioner`` draw alike): client by client, k classes uniformly among the classes
that still have room, each class having room for N*k/C clients. That draw gets stuck when a client
finds fewer than k classes with room (LN-FL: "has a probability to fail, just repeat if it fails";
18.6% of draws for N = C = 10, k = 2). Here a stuck draw is repeated from the same seeded stream,
which keeps LN-FL's distribution exactly, and after ``max_draws`` draws the last one is completed
by a deterministic repair (:func:`complete_by_moves`), so the split never fails.
``assign: cyclic`` deals the classes round-robin over a seeded class order instead.
"""

from __future__ import annotations

from collections import deque
from typing import Literal, overload

import numpy as np
from pydantic import Field

from fedsim.errors import DataError
from fedsim.partitions.base import PARTITIONERS, Labels, Partition, Partitioner, sorted_int64


def deal_classes(num_clients: int, k: int, order: np.ndarray) -> list[np.ndarray]:
    """Client i gets ``order[(i*k + j) mod C]`` for j < k: k distinct classes (k <= C), usage within one."""
    num_classes = len(order)
    return [order[(i * k + np.arange(k)) % num_classes] for i in range(num_clients)]


def class_room(num_clients: int, k: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """How many clients may hold each class: N*k/C when whole, else floor or ceil (the ceil classes drawn).

    The total is N*k and no class has room for more than N clients (k <= C): a split using every slot
    exists (Gale-Ryser), which is what lets :func:`complete_by_moves` always succeed.
    """
    room = np.full(num_classes, num_clients * k // num_classes, dtype=np.int64)
    room[rng.choice(num_classes, num_clients * k % num_classes, replace=False)] += 1
    return room


@overload
def draw_classes(
    room: np.ndarray, num_clients: int, k: int, rng: np.random.Generator, repair: Literal[True]
) -> list[set[int]]: ...


@overload
def draw_classes(
    room: np.ndarray, num_clients: int, k: int, rng: np.random.Generator, repair: bool = False
) -> list[set[int]] | None: ...


def draw_classes(
    room: np.ndarray, num_clients: int, k: int, rng: np.random.Generator, repair: bool = False
) -> list[set[int]] | None:
    """One LN-FL draw: client by client, k classes uniformly among those with room.

    A client that finds fewer than k makes the draw fail (None), as in LN-FL; with ``repair`` it
    takes those and :func:`complete_by_moves` gives it the rest.
    """
    room = room.copy()
    held: list[set[int]] = []
    for i in range(num_clients):
        open_ = np.flatnonzero(room > 0)
        if len(open_) < k and not repair:
            return None
        chosen = rng.choice(open_, min(k, len(open_)), replace=False)
        room[chosen] -= 1
        held.append({int(c) for c in chosen})
        while len(held[i]) < k:
            complete_by_moves(held, i, room)
    return held


def complete_by_moves(held: list[set[int]], i: int, room: np.ndarray) -> None:
    """Give client ``i`` one more class along a shortest chain of moves, lowest class and client first.

    Client i takes a class d it lacks; if d has no room, an earlier client j holding d gives it up
    and takes a class e it lacks instead, and so on until a class with room is reached (an augmenting
    path of the client-class flow: one exists whenever a complete split does). Every other client
    keeps k classes and every class's use stays within its room.
    """
    num_classes = len(room)
    via: dict[int, tuple[int, int] | None] = {d: None for d in range(num_classes) if d not in held[i]}
    queue = deque(via)
    while queue:
        d = queue.popleft()
        if room[d] > 0:
            break
        for j in range(i):  # only earlier clients hold classes yet
            if d in held[j]:
                for e in range(num_classes):
                    if e not in held[j] and e not in via:
                        via[e] = (j, d)
                        queue.append(e)
    else:  # unreachable while class_room's total and per-class bound hold
        raise AssertionError(f"n_class: no class can move to client {i}")
    room[d] -= 1
    while (step := via[d]) is not None:
        j, given_up = step
        held[j].remove(given_up)
        held[j].add(d)
        d = given_up
    held[i].add(d)


@PARTITIONERS.register("n_class")
class NClassPartitioner(Partitioner):
    """#C=k: each client holds k classes drawn as LN-FL does (or dealt round-robin), each class cut evenly."""

    class Params(Partitioner.Params):
        classes_per_client: int = Field(2, ge=1, description="k: distinct classes on every client")
        assign: Literal["random", "cyclic"] = Field(
            "random", description="LN-FL's random draw among classes with room, or a round-robin deal"
        )
        max_draws: int = Field(
            100, ge=1, description="random: stuck draws repeated before a deterministic repair completes one"
        )

    params: Params

    def assign(self, labels: Labels, num_clients: int, rng: np.random.Generator) -> Partition:
        train_labels, test_labels, num_classes = labels.train, labels.test, labels.num_classes
        k = self.params.classes_per_client
        if k > num_classes:
            raise DataError(
                f"n_class: classes_per_client={k} is out of range; allowed 1..{num_classes} "
                f"(the number of classes)"
            )
        assigned, repaired = self._classes(num_clients, k, num_classes, rng)
        holders: list[list[int]] = [[] for _ in range(num_classes)]
        for i, classes in enumerate(assigned):
            for c in sorted(classes):
                holders[int(c)].append(i)
        for c, who in enumerate(holders):
            n_c = int(np.count_nonzero(train_labels == c))
            if len(who) > n_c:
                raise DataError(
                    f"n_class: class {c} has {n_c} train samples but {len(who)} clients must share it "
                    f"(num_clients={num_clients}, classes_per_client={k}); "
                    f"use fewer clients or fewer classes_per_client"
                )
        train = self._deal(train_labels, holders, num_clients, rng)
        test = self._deal(test_labels, holders, num_clients, rng)
        note = "; ".join(n for n in (self._note(holders, num_clients, k), repaired) if n)
        return Partition(train=sorted_int64(train), test=sorted_int64(test), note=note)

    def _classes(
        self, num_clients: int, k: int, num_classes: int, rng: np.random.Generator
    ) -> tuple[list[set[int]], str]:
        """Every client's classes, and a note when the random draw needed the repair."""
        if self.params.assign == "cyclic":
            return [{int(c) for c in dealt} for dealt in deal_classes(num_clients, k, rng.permutation(num_classes))], ""
        room = class_room(num_clients, k, num_classes, rng)
        for _ in range(self.params.max_draws):
            if (held := draw_classes(room, num_clients, k, rng)) is not None:
                return held, ""
        note = (
            f"n_class: none of max_draws={self.params.max_draws} random draws completed; "
            f"the last was completed by moving classes between clients"
        )
        return draw_classes(room, num_clients, k, rng, repair=True), note

    @staticmethod
    def _deal(
        labels: np.ndarray, holders: list[list[int]], num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Shuffle each class and give its holders equal contiguous chunks (sizes differ by at most 1)."""
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, who in enumerate(holders):
            idx_c = rng.permutation(np.flatnonzero(labels == c))
            if who:
                for i, chunk in zip(who, np.array_split(idx_c, len(who)), strict=True):
                    parts[i].append(chunk)
        return [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]

    @staticmethod
    def _note(holders: list[list[int]], num_clients: int, k: int) -> str:
        usage = [len(w) for w in holders]
        if num_clients * k % len(holders) == 0:
            return ""
        unused = [c for c, u in enumerate(usage) if u == 0]
        note = (
            f"n_class: {num_clients} clients x {k} classes does not divide {len(holders)} classes "
            f"evenly; classes are shared by {min(usage)} to {max(usage)} clients"
        )
        return note + (f"; classes {unused} are unused (their samples go to no client)" if unused else "")
