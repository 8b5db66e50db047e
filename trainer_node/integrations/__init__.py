"""Engine adapters: L2RR and target feedback inside training engines that own their loop.

`core.py` is engine-neutral (no engine is imported): the q-weighted index stream every rank
shares, the step's rewards -> the policy's groups, and the feedback step that uploads the
engine's own HF checkpoint. `support.py` says what an engine can offer a policy (lookahead
candidates or only releases of the current model) and refuses a config that asks for more.
Each engine's glue (trl.py, verl) imports its engine lazily, from its own pyproject extra.
"""
