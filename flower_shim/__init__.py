"""The owner side of the Flower transport: a thin ClientApp that forwards each message to the
owner's own `target-owner-node` over loopback mTLS, and returns its reply verbatim.

A top-level package of its own, not part of target_owner_node: in Flower the ClientApp is code
the trainer submits (its FAB), which the owner reviews and runs beside its node, so it must be
reviewable alone and must not be able to reach the owner's internals. It imports only flwr,
protocol.public_client and protocol.federation_wire (tests/test_import_rules.py); it holds no
data path, no noise and no accounting: the owner node does all of that, once.
"""
