"""tools/bench_engine.py --shape-cost runs and reports every mode side by side (smoke test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_shape_cost_mode_reports_dynamic_and_fixed_shapes() -> None:
    command = [sys.executable, str(ROOT / "tools/bench_engine.py"), "--shape-cost", "--bench-prompts", "6",
               "--bench-samples", "2", "--bench-tokens", "3", "--repeats", "1", "--batch-size", "4"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, capture_output=True, text=True, check=True, env=env, timeout=300)
    report = json.loads(result.stdout)
    assert set(report["prompts_per_s"]) == {"dynamic", "fixed_64", "fixed_128"}
    assert all(value > 0 for value in report["prompts_per_s"].values())
    assert report["ratio_to_dynamic"]["dynamic"] == 1.0 and report["fixed_batch_prompts"] == 2
