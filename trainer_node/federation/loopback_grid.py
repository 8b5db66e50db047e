"""A Grid that delivers each message to a ClientApp in this process: the Flower transport's
message path (records, routing by `query.<action>`, replies) without Ray or a SuperLink, so the
client contract tests run on it in a second and tools/bench_flower_bytes.py measures the messages
a query sends. No run uses it: the real runtimes are exercised by tests/federation/test_simulation.py
(Flower's simulation engine) and the deployment tests (a SuperLink and SuperNodes)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

_ids = itertools.count(1)


def enter_task() -> None:
    """Building a Message outside a run needs a task identity (private flwr API, test use only)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


class LoopbackGrid:
    def __init__(self, client_app: Any, nodes: dict[int, dict[str, Any]]):
        """`nodes`: node id -> that node's node_config."""
        enter_task()
        self.client_app = client_app
        self.nodes = nodes
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        replies = []
        for message in messages:
            self.sent.append(message)
            message.metadata.__dict__["_message_id"] = f"m{next(_ids)}"
            node = message.metadata.dst_node_id
            context = Context(run_id=1, node_id=node, node_config=dict(self.nodes[node]), state=RecordDict(),
                              run_config={})
            try:
                replies.append(self.client_app(message, context))
            except Exception as error:  # noqa: BLE001 - what Flower turns into an error reply
                replies.append(Message(Error(code=2, reason=f"{type(error).__name__}: {error}"), reply_to=message))
        return replies
