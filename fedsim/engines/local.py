"""The ``local`` engine: fedsim's own Flower ``Grid``, delivering Messages without polling.

Flower's simulation runtime moves Messages through a link state that the ServerApp polls in
steps of up to 0.25 s and the engine in steps of 0.1 s: 0.8 to 1.8 s per round on 2 cores, hours
over a 10,000-round experiment. This grid hands each Message straight to the ClientApp, in this
process (``inline``) or on a pool of Ray actors that each serve a fixed set of nodes and keep their
data and model (``ray``). The ServerApp, its strategy and the ClientApp are Flower's objects,
unchanged: they cannot tell this grid from Flower's. With ``simulation.vmap_clients`` the train
Messages a worker receives go to fedsim's ClientRuntime in groups (fedsim.client.vectorized), since
a Flower ClientApp takes one Message at a time; their replies are the ones the ClientApp would send.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedsim import wire
from fedsim.client.vectorized import train_groups, train_together
from fedsim.deadline import call_within
from fedsim.engines.states import NodeStates
from fedsim.errors import TrainingError
from fedsim.plugin_guard import plugin_code
from fedsim.server.discovery import ShiftedIds

SERVER_NODE_ID = 0


def node_id_of(partition_id: int) -> int:
    """Node ids here are 1-based partition ids: stable, readable, never the server's 0."""
    return partition_id + 1


def partition_of_node_id(node_id: int) -> int:
    return node_id - 1


def node_context(run_id: int, partition_id: int, num_partitions: int) -> Context:
    return Context(
        run_id=run_id,
        node_id=node_id_of(partition_id),
        node_config={wire.PARTITION_ID: partition_id, wire.NUM_PARTITIONS: num_partitions},
        state=RecordDict(),
        run_config={},
    )


def handle(app: ClientApp, message: Message, context: Context) -> Message:
    """Run the ClientApp on one Message; an exception becomes an error reply, as in Flower."""
    try:
        return app(message, context)
    except Exception as err:  # the server's failure policy decides, as for a real SuperNode
        return wire.error_reply(message, err)


def deliver(app: ClientApp, messages: Sequence[Message], nodes: NodeStates) -> list[Message]:
    """Every message's reply, in order: groups of train messages through fedsim's ClientRuntime at once
    (``simulation.vmap_clients``), every other message through the ClientApp alone. A node's state is
    loaded only while its message is served, so a batch to every node (a checkpoint's) holds one state
    beyond ``simulation.state_memory_mb`` at a time, not the federation's."""
    jobs = [(m, nodes.context(m.metadata.dst_node_id)) for m in messages]  # states load when served
    replies: dict[int, Message] = {}
    for group in train_groups(jobs):
        with nodes.serving([jobs[i][0].metadata.dst_node_id for i in group]):
            try:
                with plugin_code():  # as the ClientApp's handlers run (fedsim.client.app)
                    replies.update(zip(group, train_together([jobs[i] for i in group]), strict=True))
            except Exception as err:  # every client of the group failed with it
                replies.update((i, wire.error_reply(jobs[i][0], err)) for i in group)
    for i, (message, context) in enumerate(jobs):
        if i not in replies:
            with nodes.serving([message.metadata.dst_node_id]):
                replies[i] = handle(app, message, context)
    return [replies[i] for i in range(len(jobs))]


def node_states(run_id: int, partitions: Sequence[int], num_partitions: int, memory_mb: float) -> NodeStates:
    """The nodes holding ``partitions`` (a range stays one: a million nodes in two numbers), their state in memory
    up to ``memory_mb``."""
    nodes: Collection[int]
    if isinstance(partitions, range):
        nodes = range(node_id_of(partitions.start), node_id_of(partitions.stop))
    else:
        nodes = {node_id_of(p) for p in partitions}

    def make(node: int) -> Context:
        return node_context(run_id, partition_of_node_id(node), num_partitions)

    return NodeStates(make, nodes, int(memory_mb * 2**20))


# what the server is doing when it sends a message of each type, for messages about it
PHASES = {
    wire.TRAIN: "training",
    wire.EVALUATE: "evaluation",
    wire.QUERY_PARTITION: "asking the clients for their partitions",
    wire.SAVE_STATE: "saving the clients' states",
    wire.LOAD_STATE: "loading the clients' states",
    wire.FEATURE_STATS: "feature statistics",
}


def phase_of(message: Message) -> str:
    """``"round 3, training"``: the round and what the server sent ``message`` for."""
    config = message.content.config_records.get(wire.CONFIG, {})
    what = PHASES.get(message.metadata.message_type, message.metadata.message_type)
    server_round = config.get(wire.SERVER_ROUND, config.get(wire.STATE_ROUND))
    return what if server_round is None else f"round {server_round}, {what}"


class InlineExecutor:
    """Runs every node's ClientApp in this process, one after another, a batch of messages within the Grid's
    timeout. A client that overruns it stops the run: it shares this process's model, data and Flower state, and
    goes on in the background, so no later round could trust them."""

    def __init__(self, app: ClientApp, run_id: int, num_partitions: int, state_memory_mb: float) -> None:
        self.app, self.num_partitions = app, num_partitions
        self.nodes = node_states(run_id, range(num_partitions), num_partitions, state_memory_mb)

    def node_ids(self) -> Collection[int]:
        return self.nodes.node_ids()

    def known_partitions(self) -> Mapping[int, int]:
        """Partition -> node of every node (all in this process, on its data): partition p is node p + 1."""
        return ShiftedIds(0, self.num_partitions, node_id_of(0))

    def execute(self, messages: Sequence[Message], timeout: float | None = None) -> list[Message]:
        """Every message's reply, in order, within ``timeout`` (the Grid's: ``train.round_timeout_s``; None:
        unbounded)."""
        if timeout is None or not messages:
            return deliver(self.app, messages, self.nodes)
        return call_within(
            lambda: deliver(self.app, messages, self.nodes), timeout, lambda: self._overran(messages, timeout)
        )

    def _overran(self, messages: Sequence[Message], timeout: float) -> TrainingError:
        late = [wire.node_partition(self.nodes.contexts[node]) for node in self.nodes.in_service]
        who = f"client{'s' * (len(late) > 1)} {', '.join(map(str, late))}" if late else "its clients"
        return TrainingError(
            f"{phase_of(messages[0])}: {who} did not finish within train.round_timeout_s = {timeout:g} s; "
            "simulation.backend: inline runs clients in fedsim's own process, which cannot go on without one "
            "(simulation.backend: ray runs them in workers, and train.on_client_failure: skip leaves out one that "
            "overruns)"
        )

    def shutdown(self) -> None:
        self.nodes.close()


def identify_as_server(run_id: int) -> None:
    """Flower's ``Message()`` reads the sending task's identity (run, node, task) from ``TaskIdentity``,
    which Flower's own runtimes set when they start a ServerApp (``flwr.superlink.runtime``,
    ``flwr.server.compat``); the local engine is this process's runtime, so it sets it the same way."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, SERVER_NODE_ID, 1


class LocalGrid(Grid):
    """A Flower ``Grid`` whose ``send_and_receive`` calls the executor directly."""

    def __init__(self, executor: InlineExecutor, run_id: int = 1) -> None:
        self.executor = executor
        self._run = Run.create_empty(run_id)
        self._ids = itertools.count(1)
        self._replies: dict[str, Message] = {}  # push_messages' handles -> the replies pull_messages returns
        identify_as_server(run_id)

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.executor.node_ids()

    def known_partitions(self) -> Mapping[int, int] | None:
        """The executor's partition -> node map where it knows it without asking every node (inline)."""
        known = getattr(self.executor, "known_partitions", None)
        return known() if known is not None else None

    # the nodes are this process's, started with it: on a resume no node holds state the run must clear
    fresh_nodes = True

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        # Delivered at once; the handles are this grid's own (a SuperLink would stamp message ids)
        messages = list(messages)
        handles = [str(next(self._ids)) for _ in messages]
        self._replies.update(zip(handles, self.executor.execute(messages), strict=True))
        return handles

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.executor.execute(list(messages), timeout)
