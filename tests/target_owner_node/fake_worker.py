"""A stand-in evaluation worker for WorkerScorer tests: no torch, starts in a second.

The decoding seed selects the behaviour: 1 = scores of 0.5, 2 = hang, 3 = crash,
4 = report a model-load failure, 5 = NaN scores.
"""

from __future__ import annotations

import os
import time

import numpy as np


def fake_worker(conn, spec) -> None:
    conn.send(("ready", {"heldout_size": 120, "test_size": 20}))
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        _, _split, checkpoints, indices, decoding = message
        shape = (len(checkpoints), len(indices))
        mode = decoding["seed"]
        if mode == 2:
            time.sleep(120)
        elif mode == 3:
            os._exit(1)
        elif mode == 4:
            conn.send(("error", "model_load_failed"))
        else:
            conn.send(("ok", np.full(shape, 0.5 if mode == 1 else np.nan)))


def wrong_size_worker(conn, spec) -> None:
    conn.send(("ready", {"heldout_size": 7, "test_size": 20}))
    conn.recv()


def slow_start_worker(conn, spec) -> None:
    """A worker still importing its libraries (torch takes seconds): ready only after a minute."""
    time.sleep(60)
    conn.send(("ready", {"heldout_size": 120, "test_size": 20}))
