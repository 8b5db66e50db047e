"""Run by torchrun (2 CPU processes, gloo) from test_trl.py: the TRL glue's rank helpers."""

import json
import os
import sys

import numpy as np
from accelerate import Accelerator

from trainer_node.integrations.trl import _broadcast_flag, _broadcast_q, _gather

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
q = _broadcast_q(accelerator, np.array([0.1, 0.2, 0.3, 0.4]) if rank == 0 else np.full(4, 0.25))
flag = _broadcast_flag(accelerator, rank == 0)
records = _gather(accelerator, [(rank, float(rank) / 2)] * (rank + 1))
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
    json.dump({"q": q.tolist(), "flag": flag, "records": [list(r) for r in records]}, fh)
