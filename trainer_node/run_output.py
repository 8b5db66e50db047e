"""What a run leaves behind: metrics.jsonl, a progress bar, summary.json, a closing table
and PNG plots.

metrics.jsonl has one JSON object per line with a `kind`: "train" (one per GRPO step) or
"eval" (a local or target accuracy measurement, with `step` and `rollouts_cumulative`).
Plots are redrawn from metrics.jsonl, so they also work on a resumed run's appended log.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from trainer_node.grpo.timing import FEEDBACK_PHASES, PHASES, cpu_key, phase_key

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf; write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunOutput:
    """Append-only step log plus live progress for one run directory."""

    def __init__(self, run_dir: Path, total_steps: int, start_step: int = 0, progress: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        if start_step == 0 and self.metrics_path.exists():
            self.metrics_path.unlink()  # a fresh run never mixes with an old log
        elif start_step > 0:
            _truncate_after(self.metrics_path, start_step)  # resume: drop steps past the checkpoint
        self.started = time.perf_counter()
        self.bar = tqdm(total=total_steps, initial=start_step, desc="grpo", unit="step",
                        disable=None if progress else True)  # None: quiet off a terminal
        self.last_train: dict[str, Any] = {}
        self.last_eval: dict[str, Any] = {}

    def _append(self, record: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps({k: _finite(v) for k, v in record.items()}, sort_keys=True) + "\n")

    def log_step(self, record: dict[str, Any]) -> None:
        self._append({"kind": "train", **record})
        self.last_train = record
        postfix = {"reward": f"{record.get('reward_mean', float('nan')):.3f}",
                   "rollouts": record.get("rollouts_cumulative", 0)}
        if "accuracy" in self.last_eval:
            postfix["acc"] = f"{self.last_eval['accuracy']:.3f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def log_eval(self, record: dict[str, Any]) -> None:
        """An accuracy record: needs step, rollouts_cumulative, accuracy; `name` tells evals apart."""
        self._append({"kind": "eval", **record})
        self.last_eval = record

    def close(self, extra: dict[str, Any] | None = None, print_table: bool = True) -> dict[str, Any]:
        """Close the bar, write summary.json and the plots, print the closing table."""
        self.bar.close()
        records = read_metrics(self.metrics_path)
        summary = summarise(records, wall_seconds=time.perf_counter() - self.started)
        summary.update(extra or {})
        (self.run_dir / SUMMARY_FILE).write_text(
            json.dumps({k: _finite(v) for k, v in summary.items()}, indent=2, sort_keys=True) + "\n"
        )
        summary["plots"] = [str(p) for p in write_plots(records, self.run_dir)]
        if print_table:
            print(format_table(summary))
        return summary


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _truncate_after(path: Path, start_step: int) -> None:
    # Train records carry the step they ran; eval records the number of steps done before them.
    kept = [r for r in read_metrics(path)
            if r.get("step", 0) < start_step or (r.get("kind") == "eval" and r.get("step", 0) == start_step)]
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


def summarise(records: Iterable[dict[str, Any]], wall_seconds: float) -> dict[str, Any]:
    records = list(records)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    rewards = [r["reward_mean"] for r in train if r.get("reward_mean") is not None]
    tail = rewards[-max(1, len(rewards) // 5):] if rewards else []
    summary: dict[str, Any] = {
        "steps": len(train),
        "rollouts_cumulative": train[-1]["rollouts_cumulative"] if train else 0,
        "reward_first": rewards[0] if rewards else None,
        "reward_last_fifth_mean": sum(tail) / len(tail) if tail else None,
        "updates_skipped": sum(1 for r in train if r.get("update_skipped")),
        "wall_seconds": round(wall_seconds, 2),
    }
    for name in sorted({r.get("name", "eval") for r in evals}):
        series = [r for r in evals if r.get("name", "eval") == name and r.get("accuracy") is not None]
        if series:
            summary[f"{name}/accuracy_first"] = series[0]["accuracy"]
            summary[f"{name}/accuracy_last"] = series[-1]["accuracy"]
    summary.update(phase_split(train))
    return summary


def _has_cpu(train: list[dict[str, Any]]) -> bool:
    """The log records the training thread's CPU per phase (runs before it did not)."""
    return any(cpu_key("generation") in r for r in train)


def phase_split(train: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds per phase over the run's steps (grpo/timing.py), their total, and the share of the
    phases that exist only for target feedback (candidates, upload, owner_wait); beside them the
    training thread's CPU seconds per phase and in all, where the log has them."""
    totals = {name: sum(r.get(phase_key(name)) or 0.0 for r in train) for name in PHASES}
    loop = sum(totals.values())
    if loop <= 0:
        return {}
    out: dict[str, Any] = {f"time/{name}_s": round(seconds, 3) for name, seconds in totals.items()}
    out["time/loop_s"] = round(loop, 3)
    out["time/feedback_share"] = round(sum(totals[name] for name in FEEDBACK_PHASES) / loop, 4)
    if _has_cpu(train):
        cpu = {name: sum(r.get(cpu_key(name)) or 0.0 for r in train) for name in PHASES}
        out.update({f"cpu/{name}_s": round(seconds, 3) for name, seconds in cpu.items()})
        out["cpu/loop_s"] = round(sum(cpu.values()), 3)
    return out


def format_table(summary: dict[str, Any]) -> str:
    rows = [(k, v) for k, v in summary.items() if k != "plots" and not isinstance(v, (dict, list))]
    width = max((len(k) for k, _ in rows), default=10)
    lines = ["run summary", "-" * (width + 16)]
    for key, value in rows:
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)


def write_plots(records: list[dict[str, Any]], run_dir: Path) -> list[Path]:
    """reward_vs_step.png; accuracy_vs_rollouts.png (if evals); time_per_phase.png (if phase
    timings); q_per_cluster.png (if q/ keys)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval" and r.get("accuracy") is not None]
    written: list[Path] = []

    def save(fig, name: str) -> None:
        path = Path(run_dir) / name
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    if train:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        points = [(r["step"], r["reward_mean"]) for r in train if r.get("reward_mean") is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel("mean rollout reward")
        ax.set_title("training reward")
        save(fig, "reward_vs_step.png")

    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name in sorted({r.get("name", "eval") for r in evals}):
            series = [r for r in evals if r.get("name", "eval") == name]
            ax.plot([r["rollouts_cumulative"] for r in series], [r["accuracy"] for r in series], marker="o", label=name)
        ax.set_xlabel("cumulative rollouts")
        ax.set_ylabel("accuracy")
        ax.legend()
        ax.set_title("accuracy vs rollouts")
        save(fig, "accuracy_vs_rollouts.png")

    if any(phase_key("generation") in r for r in train):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        steps = [r["step"] for r in train]
        bottom = [0.0] * len(train)
        for name in PHASES:
            values = [r.get(phase_key(name)) or 0.0 for r in train]
            ax.bar(steps, values, bottom=bottom, width=1.0, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
        if _has_cpu(train):  # the gap to the bars: time off CPU
            cpu = [sum(r.get(cpu_key(name)) or 0.0 for name in PHASES) for r in train]
            ax.plot(steps, cpu, color="black", linewidth=0.8, label="training thread CPU")
        ax.set_xlabel("step")
        ax.set_ylabel("seconds")
        ax.legend(fontsize="small", ncol=4)
        ax.set_title("where each step's time goes")
        save(fig, "time_per_phase.png")

    q_keys = sorted({k for r in train for k in r if k.startswith("q/")})
    if q_keys:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in q_keys:
            series = [(r["step"], r[key]) for r in train if r.get(key) is not None]
            ax.plot([s for s, _ in series], [v for _, v in series], label=key.removeprefix("q/"))
        ax.set_xlabel("step")
        ax.set_ylabel("q (sampling mass)")
        ax.legend(fontsize="small")
        ax.set_title("data-policy mass per cluster")
        save(fig, "q_per_cluster.png")
    return written
