"""The target owner's node: holds a private held-out set, evaluates checkpoints uploaded by
a trainer, and releases only aggregate (optionally differentially private) accuracy.

Modules, one job each:
    config            typed TOML config, validated once (errors name the field)
    heldout           loads the held-out / test splits (server side: sizes and domains only)
    checkpoint_store  streamed, validated, content-addressed checkpoint intake
    ledger            durable privacy ledger (fsynced before any release)
    budget            accountant + ledger + locking: charge before evaluate
    release           one Evaluate request -> one release (DP, exact, or test split)
    evaluator         server-side handle on the evaluation worker process
    worker            the worker process: loads models, generates, verifies
    audit             hash-chained audit log
    server            gRPC servicer (thin) and create_server()
    cli               `target-owner-node init | serve | audit verify`
"""
