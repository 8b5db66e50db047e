"""The trainer side of the Flower transport (the `federation` extra; docs/FLOWER.md).

`FlowerOwnerClient` is one more OwnerClient (trainer_node/feedback/context.py): the same five
calls, each one Flower message to one owner's SuperNode, where the shim (flower_shim/) forwards
it to that owner's own node. The policies, the feedback wiring and the run loop do not change.
flwr is imported only here and only when a federated run starts.
"""
