"""Generation engines: the interface (base.py), implementations, and the by-name registry.

Import `rlvr_core.engines.registry` for build_engine/engine_names; base.py stays light.
"""
