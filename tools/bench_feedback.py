"""What target feedback costs: issue 14's goals 1-5, this tree beside "today" (prints figures; not a test).

    python tools/bench_feedback.py [--today DIR [--today-python PY]] [--goals 1,2,3,4,5] [--steps 60] [--pairs 3] [--pool 10000000]

`--today DIR` is a checkout of the code the issue started from, e.g.

    mkdir /tmp/today && git archive d1b7d97 | tar -x -C /tmp/today

(its stubs need protobuf >= 7, this tree's flwr pins 6.x: give it its own environment,
`python -m venv /tmp/today-env && /tmp/today-env/bin/pip install torch==2.13.0 && /tmp/today-env/bin/pip
install -e /tmp/today`, and pass `--today-python /tmp/today-env/bin/python`), and every goal is measured there by the same code in the same run (a subprocess with
PYTHONPATH=DIR), so load on a shared machine hits both columns alike. Without it the today
column is left empty. Each goal runs in its own process (`--measure GOAL --tree DIR`, printing
one JSON object), so one tree's modules never leak into the other's figures.

1. Feedback share of wall time: `trainer-node simulate` (L2RR, default testbed, default
   cadence) with each estimator the tree has (lookahead, the default; release_difference)
   against its no-feedback ablation (policy.learn_q = false), same seed and steps, --pairs
   rounds in rotated order; the training loop's time is the sum of step_seconds. Goal: the
   median ratio <= 1.05; beside it the geometric mean of the per-round ratios with its paired
   95% t-interval. The per-phase split is read from the run's summary (this tree records it).
   L2RR moves q, so its runs train on other prompts than the ablation's, and the number of groups
   it trains varies from run to run with when releases land: `q_held` (eta_q = 0) runs the same
   feedback (queries, candidates, uploads, owner) with q held uniform, so it trains the
   ablation's batches, and its ratio is what feedback itself costs the loop
   (`release_difference_q_held` likewise for the release-only estimator). Every round also records
   the rollouts each arm trained, and the report divides them out ("loop per trained rollout"). For each arm the
   training thread's CPU seconds (summary cpu/loop_s) split the loop into computing and waiting
   (for the owner, the GIL or a core). More arms show what stands in the way on 2 cores, where
   the owner scores beside the trainer: the owner in bfloat16 ([simulated_owner] dtype) and the
   staleness bound of before (max_staleness = 8), each against the same ablation; and two show
   what the owner's CPU priority does ([simulated_owner] nice, default 19): the owner at nice 10
   (the default before) and 0, and under SCHED_IDLE (scheduler = "idle"). `--arms` runs a subset beside the ablation.
2. Bytes per query: full-parameter training, from goal 1's L2RR run (bytes the owner did not
   hold, per query, against one full checkpoint of its model); LoRA training, from a real run
   (`simulate` with [model.lora] r = 16 on q/k/v/o_proj, --lora-steps steps: the bytes its
   queries sent per query, against one full checkpoint of the tiny policy; the base folder goes
   once per run, not per query); and for a Qwen2-1.5B-shaped model in bf16 built on the meta
   device (no download, no weights): one full checkpoint against the adapter get_peft_model puts
   on it (r = 16, q/k/v/o_proj) serialised as candidates are, x 7 checkpoints per query. Goal:
   LoRA bytes per query <= 10%.
3. Upload throughput: tools/bench_owner.py of the tree (a random-init Qwen2 of --size-mb over
   mTLS loopback to `target-owner-node serve`, against a plain file copy + fsync). Goal >= 50%
   (a stretch on 2 cores). Plus the bytes of a per-tensor candidate that changes k of T tensors.
4. Sampling: L2RR and GRESO, batch 256, n = 8, a pool of --pool prompts, milliseconds per round
   of next_requests + training_groups + observe (rewards drawn at random), and the resident
   memory the policy adds. Goal <= 10 ms per round at 10M.
5. Owner start: `target-owner-node serve` from process start to "listening" (printed once health
   is SERVING), the second start of a storage folder (its calibration cached), and the time
   SIGTERM takes to end it. Goal <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = (1, 2, 3, 4, 5)
PYTHON = sys.executable


# --------------------------------------------------------------------------- measurements
# Each runs inside the tree under test (its modules first on sys.path) and returns plain data.
# They use only interfaces both trees have.


_DIFFERENCE = {"policy": 'release = { kind = "difference" }\nmax_staleness = 2',
               "grpo": 'lookahead = "adam_preconditioned"\nlookahead_directions = "cluster_mean"'}

ARMS = (  # goal 1's runs: label, (file, name) the tree must have (None: any tree), {config section: line}
    ("ablation", None, {"policy": "learn_q = false"}),  # no feedback: the yardstick
    ("feedback", None, {}),  # the default estimator (lookahead)
    # the same feedback with q held uniform: every step trains the ablation's batches, so the ratio
    # is feedback's own cost, without the change in workload that moving q brings
    ("q_held", None, {"policy": "eta_q = 0.0"}),
    ("release_difference", ("trainer_node/policies/l2rr_estimators.py", '"release_difference"'),
     {"policy": 'estimator = "release_difference"'}),  # release-only
    # the release-only estimator with q held too: its feedback's own cost, on the ablation's batches
    ("release_difference_q_held", ("trainer_node/policies/l2rr_estimators.py", '"release_difference"'),
     {"policy": 'estimator = "release_difference"\neta_q = 0.0'}),
    # difference releases (docs/RESULTS.md 11: the owner releases each candidate's clipped accuracy
    # change; the trainer measures the clip on its own prompts), at the evidence row's settings:
    # candidates along each cluster's running direction, releases landing 2 steps after their query
    ("difference", ("trainer_node/feedback/clip_calibration.py", "class ClipCalibration"), _DIFFERENCE),
    # the same with q held: every step trains the ablation's batches
    ("difference_q_held", ("trainer_node/feedback/clip_calibration.py", "class ClipCalibration"),
     {**_DIFFERENCE, "policy": _DIFFERENCE["policy"] + "\neta_q = 0.0"}),
    # lookahead with its candidates recomputed on the background thread, as before they reused the
    # update's gradients (trainer_node/grpo/gradient_tap.py): what the reuse saves, side by side
    ("lookahead_recompute", ("trainer_node/grpo/settings.py", "lookahead_from_update"),
     {"grpo": "lookahead_from_update = false"}),
    # what stands in goal 1's way on a 2-core box: the owner's scoring (its latency past
    # max_staleness steps is waited for). The same lookahead with the owner scoring in bfloat16,
    # and with the bound of before (8 steps, about what the owner takes here): what the wait costs.
    ("owner_bfloat16", ("lab/owner_process.py", "evaluation.dtype"), {"simulated_owner": 'dtype = "bfloat16"'}),
    ("staleness_8", None, {"policy": "max_staleness = 8"}),
    # the simulated owner's CPU priority (the default lowers it: [simulated_owner] nice = 19): at
    # nice 10 (the default before docs/RESULTS.md 6.15); at the trainer's own priority, what sharing
    # the cores on equal terms costs the loop; at the least priority there is (SCHED_IDLE), what
    # starving it costs
    ("owner_nice10", ("trainer_node/config.py", "simulated owner's CPU priority"), {"simulated_owner": "nice = 10"}),
    ("owner_nice0", ("trainer_node/config.py", "simulated owner's CPU priority"), {"simulated_owner": "nice = 0"}),
    ("owner_idle", ("trainer_node/config.py", "CPU scheduling policy"), {"simulated_owner": 'scheduler = "idle"'}),
)


def measure_simulate(tree: Path, work: Path, steps: int, seed: int, pairs: int = 1,
                     only: set[str] | None = None) -> dict:
    """Goal 1 and the measured half of goal 2: L2RR with feedback (each estimator the tree has)
    and its learn_q = false ablation, `pairs` rounds, the arms' order rotated each round so that
    load drifting on a shared machine hits every arm alike. The first round's runs are kept whole
    (phases, bytes); every round's loop time is in `rounds`, and the report takes the median of
    the per-round ratios. `only`: the arms to run (the ablation always runs); None: all."""
    defaults = (tree / "lab" / "configs" / "simulate_default.toml").read_text()
    arms = [(label, lines) for label, needs, lines in ARMS
            if (needs is None or needs[1] in (tree / needs[0]).read_text())  # "today" lacks the later arms
            and (only is None or label == "ablation" or label in only)]
    out: dict = {"rounds": [], "round_rollouts": []} | ({"only": sorted(only)} if only is not None else {})
    for round_ in range(max(pairs, 1)):
        loops, rollouts = {}, {}
        for label, lines in arms[round_ % len(arms):] + arms[:round_ % len(arms)]:
            run = _simulate_once(tree, work / f"simulate-{label}-{round_}", defaults, lines, steps, seed)
            loops[label], rollouts[label] = run["loop_s"], run["train_rollouts"]
            out.setdefault(label, run)
        out["rounds"].append(loops)
        out["round_rollouts"].append(rollouts)  # L2RR moves q, and with it how many rollouts each round trains
    return out


def _simulation_config(defaults: str) -> str:
    """simulate's defaults with ROOT's tiny-policy cache (one policy for both trees, built once,
    keyed by its inputs) and no periodic evaluation."""
    text = re.sub(r"(?m)^cache_dir = .*$", f"cache_dir = {json.dumps(str(ROOT / '.cache' / 'tiny_policies'))}",
                  defaults)
    return re.sub(r"(?m)^eval_every = .*$", "eval_every = 0", text)


def _run_simulate(tree: Path, run: Path, text: str, steps: int, seed: int) -> tuple[list[dict], dict, float]:
    """One `trainer-node simulate --method l2rr` of the tree with config `text`: its step records,
    its summary and its process wall time."""
    config = run.with_suffix(".toml")
    config.write_text(text)
    command = [PYTHON, "-m", "trainer_node.cli", "simulate", "--method", "l2rr", "--seed", str(seed),
               "--steps", str(steps), "--out", str(run), "--config", str(config), "--no-progress"]
    started = time.perf_counter()
    subprocess.run(command, cwd=tree, env=_env(tree), check=True, capture_output=True)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if "step_seconds" in r], json.loads((run / "summary.json").read_text()), wall


def arm_config(defaults: str, lines: dict[str, str]) -> str:
    """simulate's config for one arm: each of its lines goes first in its section (added when missing)."""
    text = _simulation_config(defaults)
    for section, line in lines.items():
        if not re.search(rf"(?m)^\[{section}\]$", text):
            text += f"\n[{section}]\n"
        text = re.sub(rf"(?m)^\[{section}\]$", f"[{section}]\n{line}", text)
    return text


def _simulate_once(tree: Path, run: Path, defaults: str, lines: dict[str, str], steps: int, seed: int) -> dict:
    text = arm_config(defaults, lines)
    steps_, summary, wall = _run_simulate(tree, run, text, steps, seed)
    phases = {k.removeprefix("time/").removesuffix("_s"): v for k, v in summary.items()
              if k.startswith("time/") and k.endswith("_s")}
    weights = sum(p.stat().st_size for p in _model_dir(tree).glob("*.safetensors"))
    return {
        "loop_s": sum(r["step_seconds"] for r in steps_),
        "cpu_s": summary.get("cpu/loop_s"),  # the training thread's CPU in the loop (None: not recorded)
        "train_rollouts": sum(r.get("train_rollouts", 0) for r in steps_),
        "process_s": wall,
        "steps": len(steps_),
        "phases_s": phases,
        "queries": summary.get("feedback_queries"),
        "candidates": summary.get("feedback_candidates"),
        "uploaded_bytes": summary.get("feedback_uploaded_bytes"),
        "epsilon_spent": summary.get("epsilon_spent"),
        "target_accuracy_after": summary.get("target_accuracy_after"),
        "checkpoint_bytes": weights,
        # the arms sample different prompts once q moves: generated tokens tell overhead from workload
        "generated_tokens": sum(r.get("rollouts_generated", 0) * r.get("completion_len_mean", 0) for r in steps_),
        "background": {k.removeprefix("feedback_background/"): v for k, v in summary.items()
                       if k.startswith("feedback_background/")},
        "summary_keys": sorted(summary),
    }


def _model_dir(tree: Path) -> Path:
    """The simulation's cached tiny policy (both trees use ROOT's cache)."""
    cache = ROOT / ".cache" / "tiny_policies"
    found = next((f for f in sorted(cache.glob("qwen2-*")) if f.is_dir()), None)
    if found is None:
        raise SystemExit(f"no tiny policy cached under {cache}: `trainer-node simulate` builds it on its first run")
    return found


LORA_RANK, LORA_TARGETS = 16, ("q_proj", "k_proj", "v_proj", "o_proj")  # goal 2's adapter, both figures


def measure_bytes(tree: Path, work: Path, lora_steps: int, seed: int, lora_upload: bool = False) -> dict:
    """Goal 2: a Qwen2-1.5B-shaped model in bf16 (a full checkpoint against a LoRA adapter of its
    real PEFT module shapes), and the bytes per query of a real LoRA run of the tiny policy; with
    `lora_upload`, the time to upload that model's adapters to an owner holding its base."""
    # what the tree under test has, read from its files: an editable install of another tree on
    # sys.path must not lend it modules (today's tree has neither)
    trains_lora = (tree / "trainer_node" / "lora.py").is_file()
    out = _bytes_qwen2_1p5b(trains_lora, (tree / "protocol" / "adapter_rules.py").is_file())
    if lora_steps > 0 and trains_lora:
        out["lora_run"] = measure_lora_run(tree, work, lora_steps, seed)
    if lora_upload and trains_lora:
        out["lora_upload"] = measure_lora_upload(work)
    return out


def _bytes_qwen2_1p5b(trains_lora: bool, accepts_adapters: bool) -> dict:
    """Built on the meta device (nothing 1.5B is allocated). Where the tree trains LoRA, the
    adapter is get_peft_model's on that model (trainer_node/lora.py), serialised as candidates are
    (zeros of its exact names, shapes and dtype); elsewhere the same names written by hand."""
    import torch
    from safetensors.torch import save
    from transformers import AutoModelForCausalLM

    config = _qwen2_1p5b_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    shapes = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)  # one stored copy, as save_pretrained writes it
    full = sum(2 * _numel(s) for s in shapes.values())
    parameters = sum(_numel(s) for s in shapes.values())
    if not trains_lora:
        source, adapter = "names by hand (this tree does not train LoRA)", {}
        for name, shape in shapes.items():
            module = name.removesuffix(".weight")
            if module.rsplit(".", 1)[-1] in LORA_TARGETS:
                out_f, in_f = shape
                adapter[f"base_model.model.{module}.lora_A.weight"] = torch.zeros(LORA_RANK, in_f, dtype=torch.bfloat16)
                adapter[f"base_model.model.{module}.lora_B.weight"] = torch.zeros(out_f, LORA_RANK, dtype=torch.bfloat16)
    else:
        from trainer_node.lora import LoraSettings, adapter_tensors, apply_lora

        wrapped = apply_lora(model, LoraSettings(r=LORA_RANK, alpha=2.0 * LORA_RANK, target_modules=list(LORA_TARGETS)))
        source = "get_peft_model on the meta model"
        adapter = {name: torch.zeros(t.shape, dtype=t.dtype) for name, t in adapter_tensors(wrapped).items()}
    adapter_bytes = len(save(adapter, metadata={"format": "pt"}))
    validated = None
    if accepts_adapters:  # the owner's own check of the adapter against the base
        from protocol.adapter_rules import validate_adapter
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "adapter_model.safetensors"
            path.write_bytes(save(adapter))
            cfg = json.dumps({"peft_type": "LORA", "r": LORA_RANK, "lora_alpha": 32, "target_modules": list(LORA_TARGETS)})
            validate_adapter(cfg.encode(), path, "Qwen2ForCausalLM", shapes, "model.embed_tokens.weight")
            validated = True
    return {"parameters": parameters, "full_bytes": full, "tensors": len(shapes),
            "lora_rank": LORA_RANK, "lora_targets": list(LORA_TARGETS), "adapter_bytes": adapter_bytes,
            "adapter_parameters": sum(_numel(tuple(t.shape)) for t in adapter.values()), "adapter_source": source,
            "adapter_validated": validated}


def measure_lora_run(tree: Path, work: Path, steps: int, seed: int) -> dict:
    """`trainer-node simulate` (L2RR, default testbed and cadence) training a [model.lora] adapter
    (r = LORA_RANK on LORA_TARGETS): the bytes its queries sent (the client's upload accounting,
    metrics.jsonl's feedback_query_uploaded_bytes) against one full checkpoint of the tiny policy."""
    text = _simulation_config((tree / "lab" / "configs" / "simulate_default.toml").read_text())
    text += (f"\n[model.lora]\nr = {LORA_RANK}\nalpha = {2 * LORA_RANK}\n"
             f"target_modules = {json.dumps(list(LORA_TARGETS))}\n")
    step_records, summary, wall = _run_simulate(tree, work / "simulate-lora", text, steps, seed)
    last = step_records[-1]
    return {"steps": summary.get("steps"), "queries": summary.get("feedback_queries"),
            "failures": summary.get("feedback_failures"), "candidates": summary.get("feedback_candidates"),
            "query_bytes": last.get("feedback_query_uploaded_bytes"),
            "uploaded_bytes": summary.get("feedback_uploaded_bytes"),
            "checkpoint_bytes": sum(p.stat().st_size for p in _model_dir(tree).glob("*.safetensors")),
            "process_s": wall}


def measure_lora_upload(work: Path, candidates: int = 7) -> dict:
    """Goal 2's upload time (`--lora-upload`, this tree only): a random-init Qwen2-1.5B-shaped model
    in bf16 with the LoRA adapter of _bytes_qwen2_1p5b, written by the run's own writer
    (trainer_node/feedback/adapters.py) and sent by the run's own client to a real
    `target-owner-node serve` on mTLS loopback. The base folder (3 GB) goes once, with the first
    adapter, and includes the owner's dry run of the new structure; then one query's
    `candidates` checkpoints, each a new adapter beside the base the owner holds, timed apart."""
    import torch
    from transformers import AutoModelForCausalLM

    from lab.owner_process import OwnerProcess, init_owner
    from rlvr_core.models.loading import load_tokenizer
    from trainer_node.feedback.adapters import AdapterCandidateWriter
    from trainer_node.feedback.client import TargetFeedbackClient
    from trainer_node.lora import LoraSettings, apply_lora

    torch.manual_seed(0)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_config(_qwen2_1p5b_config(), torch_dtype=torch.bfloat16)
    model = apply_lora(model, LoraSettings(r=LORA_RANK, alpha=2.0 * LORA_RANK, target_modules=list(LORA_TARGETS)))
    build_s = time.perf_counter() - started
    tokenizer = load_tokenizer(_model_dir(ROOT))  # any tokenizer whose ids are rows of the embedding
    started = time.perf_counter()
    writer = AdapterCandidateWriter(model, tokenizer, work / "candidates")
    base_write_s = time.perf_counter() - started
    init_owner(work / "owner", "small", dp=True, sample_rate=1.0, planned_releases=50)
    lora_b = [p for n, p in model.named_parameters() if ".lora_B." in n]
    uploads = []
    with OwnerProcess(work / "owner", startup_timeout_s=300) as owner:
        client = TargetFeedbackClient(owner.client_settings(upload_deadline_s=3600.0))
        try:
            for index in range(candidates + 1):
                with torch.no_grad():  # a new adapter per checkpoint, as a lookahead step makes
                    for param in lora_b:
                        param.add_(1e-3)
                started = time.perf_counter()
                written = writer.write(model.state_dict(keep_vars=True), f"cand{index}")
                write_s = time.perf_counter() - started
                started = time.perf_counter()
                client.upload(written.directory, written.digests)
                uploads.append({"write_s": write_s, "upload_s": time.perf_counter() - started,
                                "bytes": int(client.last_upload_bytes)})
                writer.discard(written)
        finally:
            client.close()
    per_query = uploads[1:]
    return {"build_s": build_s, "base_write_s": base_write_s, "base_bytes": writer.base_bytes,
            "first": uploads[0], "candidates": per_query,
            "query_upload_s": sum(u["upload_s"] for u in per_query),
            "query_write_s": sum(u["write_s"] for u in per_query),
            "query_bytes": sum(u["bytes"] for u in per_query)}


def _qwen2_1p5b_config():
    from transformers import Qwen2Config

    return Qwen2Config(  # Qwen2-1.5B's published shape
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True, torch_dtype="bfloat16",
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def measure_upload(tree: Path, size_mb: int) -> dict:
    """Goal 3: the tree's tools/bench_owner.py upload figures, and k-of-T candidate bytes."""
    command = [PYTHON, str(tree / "tools" / "bench_owner.py"), "--size-mb", str(size_mb), "--prompts", "4",
               "--samples", "1", "--max-new-tokens", "2"]
    text = subprocess.run(command, cwd=tree, env=_env(tree), check=True, capture_output=True, text=True).stdout
    upload = float(re.search(r"upload over mTLS loopback: ([0-9.]+) MiB/s", text).group(1))
    copy = float(re.search(r"plain file copy \+ fsync: +([0-9.]+) MiB/s", text).group(1))
    return {"upload_mib_s": upload, "copy_mib_s": copy, "size_mb": size_mb, **_k_of_t()}


def _k_of_t() -> dict:
    """Bytes a candidate that changes k of T tensors adds to what the owner holds (this tree's
    CandidateWriter); today's writer sends one model.safetensors: every byte, whatever k."""
    try:
        from trainer_node.feedback.candidates import CandidateWriter
    except ImportError:
        return {"k_of_t": None}
    import torch

    from rlvr_core.models.loading import load_policy

    model, tokenizer = load_policy(_model_dir(ROOT), "cpu", torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        writer = CandidateWriter(model, tokenizer, Path(tmp))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        first = writer.write(state, "base")
        total = sum(size for name, size in first.sizes.items() if name.endswith(".safetensors"))
        names = list(writer.tensor_names)
        k = max(1, len(names) // 10)
        changed = dict(state)
        for name in names[:k]:
            changed[name] = state[name] + 1.0
        second = writer.write(changed, "candidate")
        before = set(first.digests.values())
        new = sum(second.sizes[name] for name, digest in second.digests.items() if digest not in before)
        changed_bytes = sum(state[name].numel() * state[name].element_size() for name in names[:k])
    return {"k_of_t": {"k": k, "T": len(names), "bytes_new": new, "bytes_full": total,
                       "bytes_of_changed_tensors": changed_bytes}}


def measure_sampler(pool_size: int, rounds: int, policies: list[str]) -> dict:
    """Goal 4: ms per round of the policy's own work at `pool_size` prompts (batch 256, n = 8)."""
    import numpy as np

    from rlvr_core.tasks.example import Example
    from trainer_node.policies.base import Group, Rollout, SourcePool, StepRollouts

    example = Example(id="p", prompt="1+1=", answer="2", domain="add", verifier="exact_match")
    names = [f"c{i}" for i in range(6)]
    clusters = tuple(names[i % len(names)] for i in range(pool_size))
    pool = SourcePool(examples=(example,) * pool_size, clusters=clusters)  # one object, pool_size refs
    out = {}
    for name in policies:
        rss_before = _rss_mb()
        policy = _policy(name, pool)
        rng = np.random.default_rng(1)
        rss_after = _rss_mb()
        spent, count = 0.0, 0
        for step in range(rounds + 1):
            so_far = StepRollouts()
            started = time.perf_counter()
            while True:
                requests = policy.next_requests(step, so_far)
                if not requests:
                    break
                count += step > 0
                paused = time.perf_counter()
                groups = [Group(r.index, clusters[r.index], [Rollout("", float(rng.random() < 0.5), (), ())
                                                             for _ in range(r.num_rollouts)]) for r in requests]
                started += time.perf_counter() - paused  # building fake rollouts is not the sampler's work
                so_far.add(groups)
                if so_far.rounds >= 8:
                    break
            policy.observe(step, so_far.groups)
            policy.training_groups(step, so_far)
            if step > 0:  # step 0 warms caches
                spent += time.perf_counter() - started
        out[name] = {"ms_per_round": 1000 * spent / max(count, 1), "ms_per_step": 1000 * spent / rounds,
                     "rounds_per_step": count / rounds, "policy_rss_mb": rss_after - rss_before}
        del policy
    return {"pool": pool_size, **out}


SAMPLERS = {  # the policies goal 4 times: module, policy class, options class (same in both trees)
    "l2rr": ("trainer_node.policies.l2rr", "L2rrPolicy", "L2rrOptions"),
    "greso": ("trainer_node.policies.greso", "GresoPolicy", "GresoOptions"),
}


def _policy(name: str, pool):
    import importlib

    import numpy as np

    module_name, policy_class, options_class = SAMPLERS[name]
    module = importlib.import_module(module_name)
    options = getattr(module, options_class)(batch_size=256, rollouts_per_prompt=8)
    return getattr(module, policy_class)(pool, options, np.random.default_rng(0))


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / (1 << 20)


def measure_owner_start(tree: Path, work: Path) -> dict:
    """Goal 5: process start to 'listening' (health SERVING), twice on one storage folder, and shutdown."""
    from lab.owner_process import OwnerProcess, init_owner

    folder = work / "owner"
    init_owner(folder, "default", dp=True)
    out = {}
    for label in ("first", "cached"):
        owner = OwnerProcess(folder)
        started = time.perf_counter()
        owner.start()
        out[f"{label}_start_s"] = time.perf_counter() - started
        started = time.perf_counter()
        owner.stop(grace_s=60)
        out[f"{label}_stop_s"] = time.perf_counter() - started
    drain = re.search(r"(?m)^drain_delay_s = ([0-9.]+)", (folder / "config.toml").read_text())
    out["drain_delay_s"] = float(drain.group(1)) if drain else None
    return out


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}


# ------------------------------------------------------------------------------ driver


def run_goal(goal: int, tree: Path, args: argparse.Namespace, python: str = PYTHON) -> dict:
    command = [python, str(Path(__file__).resolve()), "--measure", str(goal), "--tree", str(tree),
               "--steps", str(args.steps), "--seed", str(args.seed), "--pool", str(args.pool),
               "--rounds", str(args.rounds), "--pairs", str(args.pairs), "--size-mb", str(args.size_mb),
               "--policies", args.policies, "--lora-steps", str(args.lora_steps), "--arms", args.arms] + (["--lora-upload"] if args.lora_upload else [])
    started = time.perf_counter()
    done = subprocess.run(command, check=False, cwd=tree, env=_env(tree), capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1], "seconds": time.perf_counter() - started}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "seconds": time.perf_counter() - started}


def chosen_arms(spec: str) -> set[str] | None:
    """--arms: None for "all", else the labels; an unknown one is an error naming the known ones."""
    if spec.strip() == "all":
        return None
    labels = {label.strip() for label in spec.split(",") if label.strip()}
    known = [label for label, *_ in ARMS]
    unknown = sorted(labels - set(known))
    if unknown:
        raise SystemExit(f"--arms: unknown arm {unknown[0]!r}; the arms are {', '.join(known)} (or all)")
    return labels


def measure(goal: int, args: argparse.Namespace) -> dict:
    tree = Path(args.tree)
    with tempfile.TemporaryDirectory(prefix="bench-feedback-") as tmp:
        work = Path(tmp)
        if goal == 1:
            return measure_simulate(tree, work, args.steps, args.seed, args.pairs, chosen_arms(args.arms))
        if goal == 2:
            return measure_bytes(tree, work, args.lora_steps, args.seed, args.lora_upload)
        if goal == 3:
            return measure_upload(tree, args.size_mb)
        if goal == 4:
            return measure_sampler(args.pool, args.rounds, args.policies.split(","))
        if goal == 5:
            return measure_owner_start(tree, work)
    raise ValueError(goal)


def report(results: dict[str, dict[int, dict]]) -> list[str]:
    """The side-by-side table: one line per figure, this tree | today."""
    rows: list[tuple[str, str, str, str]] = []

    def both(goal: int, label: str, fn, target: str = "") -> None:
        cells = []
        for tree in ("now", "today"):
            data = results.get(tree, {}).get(goal)
            if data is None:
                cells.append("-")
            elif "error" in data:
                cells.append("error: " + data["error"][:60])
            else:
                try:
                    cells.append(fn(data))
                except (KeyError, TypeError, ZeroDivisionError):
                    cells.append("n/a")
        rows.append((label, cells[0], cells[1], target))

    both(1, "1 loop time, L2RR lookahead / learn_q=false", lambda d: _loop_ratio(d, "feedback"), "<= 1.05x")
    both(1, "1 feedback phases, lookahead", lambda d: _feedback_share(d["feedback"]))
    both(1, "1 background thread, lookahead", lambda d: _background(d["feedback"]))
    both(1, "1 loop per generated token, lookahead / ablation", lambda d: _per_token_ratio(d, "feedback"))
    both(1, "1 loop per trained rollout, lookahead / ablation", lambda d: _per_rollout_ratio(d, "feedback"))
    both(1, "1 training thread, lookahead", lambda d: _training_thread(d, "feedback"))
    both(1, "1 loop time, lookahead with q held / abl.", lambda d: _loop_ratio(d, "q_held"),
         "(feedback's own cost)")
    both(1, "1 training thread, lookahead with q held", lambda d: _training_thread(d, "q_held"))
    both(1, "1 feedback phases, lookahead with q held", lambda d: _feedback_share(d["q_held"]))
    both(1, "1 loop time, L2RR release_difference / learn_q=false", lambda d: _loop_ratio(d, "release_difference"),
         "<= 1.05x")
    both(1, "1 feedback phases, release_difference", lambda d: _feedback_share(d["release_difference"]))
    both(1, "1 background thread, release_difference", lambda d: _background(d["release_difference"]))
    both(1, "1 loop per generated token, release_difference / abl.", lambda d: _per_token_ratio(d, "release_difference"))
    both(1, "1 loop time, release_difference, q held / abl.", lambda d: _loop_ratio(d, "release_difference_q_held"),
         "(feedback's own cost)")
    both(1, "1 training thread, release_difference, q held",
         lambda d: _training_thread(d, "release_difference_q_held"))
    both(1, "1 loop time, difference releases / learn_q=false", lambda d: _loop_ratio(d, "difference"), "<= 1.05x")
    both(1, "1 loop per trained rollout, difference / ablation", lambda d: _per_rollout_ratio(d, "difference"))
    both(1, "1 background thread, difference", lambda d: _background(d["difference"]))
    both(1, "1 training thread, difference", lambda d: _training_thread(d, "difference"))
    both(1, "1 loop time, difference, q held / abl.", lambda d: _loop_ratio(d, "difference_q_held"),
         "(feedback's own cost)")
    both(1, "1 training thread, difference, q held", lambda d: _training_thread(d, "difference_q_held"))
    both(1, "1 loop time, lookahead recomputing candidates / abl.", lambda d: _loop_ratio(d, "lookahead_recompute"),
         "(before the reuse)")
    both(1, "1 background thread, lookahead recomputing", lambda d: _background(d["lookahead_recompute"]))
    both(1, "1 loop time, lookahead, owner in bfloat16 / abl.", lambda d: _loop_ratio(d, "owner_bfloat16"),
         "(what the owner's speed costs)")
    both(1, "1 feedback phases, owner in bfloat16", lambda d: _feedback_share(d["owner_bfloat16"]))
    both(1, "1 loop time, lookahead, max_staleness 8 / abl.", lambda d: _loop_ratio(d, "staleness_8"),
         "(what a tighter bound costs)")
    both(1, "1 feedback phases, max_staleness 8", lambda d: _feedback_share(d["staleness_8"]))
    both(1, "1 loop time, lookahead, owner at nice 10 / abl.", lambda d: _loop_ratio(d, "owner_nice10"),
         "(the owner's priority before)")
    both(1, "1 loop time, lookahead, owner not niced / abl.", lambda d: _loop_ratio(d, "owner_nice0"),
         "(what equal CPU priority costs)")
    both(1, "1 feedback phases, owner not niced", lambda d: _feedback_share(d["owner_nice0"]))
    both(1, "1 loop time, lookahead, owner SCHED_IDLE / abl.", lambda d: _loop_ratio(d, "owner_idle"),
         "(what starving the owner costs)")
    both(1, "1 feedback phases, owner SCHED_IDLE", lambda d: _feedback_share(d["owner_idle"]))
    both(1, "2 full-param: bytes/query / checkpoint (tiny)", lambda d: _bytes_per_query(d), "(reported)")
    both(2, "2 Qwen2-1.5B bf16: LoRA r16 bytes/query / ckpt", lambda d: _lora_share(d), "<= 10%")
    both(2, "2 LoRA r16 run: bytes/query / checkpoint (tiny)", lambda d: _lora_run_share(d), "(reported)")
    both(2, "2 Qwen2-1.5B bf16: upload of 1 query's adapters", lambda d: _lora_upload_cell(d), "(reported)")
    both(3, "3 upload mTLS / plain copy", lambda d: f"{d['upload_mib_s'] / d['copy_mib_s']:.0%} "
         f"({d['upload_mib_s']:.0f} / {d['copy_mib_s']:.0f} MiB/s, {d['size_mb']} MB)", ">= 50% (stretch)")
    both(3, "3 candidate changing k of T tensors sends", lambda d: _k_of_t_cell(d), "~ k/T")
    for name in ("l2rr", "greso"):
        both(4, f"4 {name} ms/round", lambda d, n=name: f"{d[n]['ms_per_round']:.1f} ms "
             f"(pool {d['pool']:,}, {d[n]['policy_rss_mb']:.0f} MiB)", "<= 10 ms at 10M")
    both(5, "5 owner start, calibration cached", lambda d: f"{d['cached_start_s']:.2f} s (first {d['first_start_s']:.2f} s)",
         "<= 2 s")
    both(5, "5 owner shutdown (SIGTERM to exit)", lambda d: f"{d['cached_stop_s']:.2f} s (drain {d['drain_delay_s']} s)")
    width = [max(len(r[i]) for r in rows + [("figure", "this tree", "today", "goal")]) for i in range(4)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(("figure", "this tree", "today", "goal"), width))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, width)) for row in rows]
    return lines


def _loop_ratio(data: dict, arm: str) -> str:
    """The median over rounds of (loop with feedback / loop without), with every round's ratio."""
    if arm not in data:
        return "not run (--arms)" if arm not in data.get("only", [arm]) else "not in this tree"
    rounds = [r for r in data.get("rounds") or [{arm: data[arm]["loop_s"], "ablation": data["ablation"]["loop_s"]}]
              if arm in r and "ablation" in r]
    run = data[arm]
    each = ", ".join(f"{r[arm]:.0f}/{r['ablation']:.0f}" for r in rounds)
    return (f"{_ratios_cell([r[arm] / r['ablation'] for r in rounds])} ({each} s; {run['steps']} steps, "
            f"{run['queries']} queries)")


def _ratios_cell(ratios: list[float]) -> str:
    """"<median>x median of <n>", and the geometric mean with its paired interval from two rounds on."""
    interval = paired_interval(ratios)
    mean = f"; geometric mean {interval[0]:.2f}x [{interval[1]:.2f}, {interval[2]:.2f}]" if interval else ""
    return f"{statistics.median(ratios):.2f}x median of {len(ratios)}{mean}"


def paired_interval(ratios: list[float], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """The geometric mean of per-round ratios and its t-interval (each round pairs an arm with the
    ablation run beside it, so the pair's ratio is one observation); None under two rounds."""
    import math

    from lab.bench.stats import t_interval

    if len(ratios) < 2:
        return None
    logs = t_interval([math.log(r) for r in ratios], confidence)
    return math.exp(logs.mean), math.exp(logs.low), math.exp(logs.high)


def _feedback_share(run: dict) -> str:
    phases = run["phases_s"]
    if not phases:
        return "not recorded"
    feedback = sum(phases.get(k, 0.0) for k in ("candidates", "upload", "owner_wait"))
    return (f"{feedback / run['loop_s']:.1%} of the loop ({feedback:.1f} s, waiting for the owner "
            f"{phases.get('owner_wait', 0.0):.1f} s)")


def _background(run: dict) -> str:
    """What the asynchronous queries' thread did (first round): its CPU seconds, which it can take
    from the training thread on a shared CPU, and its wall split."""
    bg = run.get("background") or {}
    if not bg:
        return "not recorded"
    return (f"CPU {bg['cpu_s']:.1f} s = {bg['cpu_s'] / run['loop_s']:.1%} of the loop (wall: candidates "
            f"{bg['candidates_s']:.1f}, upload {bg['upload_s']:.1f}, owner {bg['owner_s']:.1f} s)")


def _training_thread(data: dict, arm: str) -> str:
    """First round: the training thread's CPU against the loop (the rest it spent waiting), its CPU
    against the ablation's, and the rollouts each trained (the work the update phase did)."""
    if arm not in data:
        return "not run (--arms)"
    run, base = data[arm], data["ablation"]
    if run.get("cpu_s") is None or base.get("cpu_s") is None:
        return "not recorded"
    return (f"CPU {run['cpu_s']:.1f} s of a {run['loop_s']:.1f} s loop (off CPU {run['loop_s'] - run['cpu_s']:.1f} s, "
            f"ablation {base['loop_s'] - base['cpu_s']:.1f} s); CPU / ablation's {run['cpu_s'] / base['cpu_s']:.2f}x; "
            f"trained {run['train_rollouts']:,.0f} vs {base['train_rollouts']:,.0f} rollouts")


def _per_token_ratio(data: dict, arm: str) -> str:
    """(loop / generated tokens) with feedback over the same without, first round: the loop ratio
    with the arms' different workloads (q moves what is sampled) divided out."""
    run, base = data[arm], data["ablation"]
    if not run.get("generated_tokens") or not base.get("generated_tokens"):
        return "not recorded"
    ratio = (run["loop_s"] / run["generated_tokens"]) / (base["loop_s"] / base["generated_tokens"])
    return f"{ratio:.2f}x ({run['generated_tokens']:,.0f} vs {base['generated_tokens']:,.0f} tokens)"


def _per_rollout_ratio(data: dict, arm: str) -> str:
    """Per round, (loop / trained rollouts) with feedback over the same without: the loop ratio with
    L2RR's own choice of work divided out. The q it learns changes which groups survive the filters,
    and every trained rollout is update work, so its rounds train more or fewer rollouts than the
    ablation's; goal 1 counts that too. Beside it, the median ratio of trained rollouts."""
    pairs = [(loops, counts) for loops, counts in zip(data.get("rounds", []), data.get("round_rollouts", []))
             if arm in counts and counts.get(arm) and counts.get("ablation")]
    if not pairs:
        return "not recorded"
    ratios = [(loops[arm] / counts[arm]) / (loops["ablation"] / counts["ablation"]) for loops, counts in pairs]
    work = statistics.median(counts[arm] / counts["ablation"] for _, counts in pairs)
    return f"{_ratios_cell(ratios)} (trained rollouts: {work:.2f}x the ablation's, median)"


def _bytes_per_query(data: dict) -> str:
    run = data["feedback"]
    if not run["uploaded_bytes"] or not run["queries"]:
        return "not recorded"
    per_query = run["uploaded_bytes"] / run["queries"]
    return f"{per_query / run['checkpoint_bytes']:.2f} checkpoints ({per_query / 2**20:.1f} MiB, {run['queries']} queries)"


def _lora_share(data: dict) -> str:
    candidates = 7  # the base plus 6 candidates, the count per query
    if data.get("adapter_validated") is None:  # a tree without adapter support sends full checkpoints
        return f"{candidates:.0%} ({candidates} full checkpoints: no adapters)"
    return (f"{candidates * data['adapter_bytes'] / data['full_bytes']:.1%} "
            f"({candidates} x {data['adapter_bytes'] / 2**20:.1f} MiB vs {data['full_bytes'] / 2**30:.2f} GiB)")


def _lora_run_share(data: dict) -> str:
    run = data.get("lora_run")
    if run is None:
        return "not run (no LoRA training, or --lora-steps 0)"
    if not run["queries"]:
        return f"no query in {run['steps']} steps"
    per_query = run["query_bytes"] / run["queries"]
    return (f"{per_query / run['checkpoint_bytes']:.1%} ({per_query / 2**10:.0f} KiB = "
            f"{run['candidates'] / run['queries']:.1f} adapters/query, {run['queries']} queries; "
            f"base once: {run['checkpoint_bytes'] / 2**20:.1f} MiB)")


def _lora_upload_cell(data: dict) -> str:
    up = data.get("lora_upload")
    if up is None:
        return "not measured (--lora-upload)"
    count = len(up["candidates"])
    return (f"{up['query_upload_s']:.2f} s upload + {up['query_write_s']:.2f} s write for {count} adapters "
            f"({up['query_bytes'] / 2**20:.1f} MiB); base once: {up['first']['upload_s']:.0f} s "
            f"({up['base_bytes'] / 2**30:.2f} GiB, with the owner's dry run)")


def _k_of_t_cell(data: dict) -> str:
    k = data.get("k_of_t")
    if not k:
        return "T/T (one model.safetensors)"
    share = k.get("bytes_of_changed_tensors", 0) / k["bytes_full"]
    return (f"{k['bytes_new'] / k['bytes_full']:.1%} of the bytes for k/T = {k['k']}/{k['T']} tensors "
            f"holding {share:.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--today", type=Path, help="a checkout of the commit the issue started from")
    parser.add_argument("--today-python", type=Path,
                        help="the interpreter of an environment that runs --today (its generated stubs may need "
                        "another protobuf than this tree's); default: this one")
    parser.add_argument("--goals", default="1,2,3,4,5", help="comma-separated goals to measure")
    parser.add_argument("--steps", type=int, default=60, help="goal 1: simulate steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", type=int, default=3,
                        help="goal 1: rounds of runs of every arm (the ablation and --arms); median ratio")
    parser.add_argument("--arms", default="all",
                        help="goal 1: comma-separated arms to run beside the ablation, or all: "
                        + ", ".join(label for label, *_ in ARMS[1:]))
    parser.add_argument("--pool", type=int, default=10_000_000, help="goal 4: prompts in the pool")
    parser.add_argument("--rounds", type=int, default=5, help="goal 4: timed steps per policy")
    parser.add_argument("--policies", default="l2rr,greso", help="goal 4: policies to time")
    parser.add_argument("--size-mb", type=int, default=100, help="goal 3: checkpoint size")
    parser.add_argument("--lora-steps", type=int, default=40, help="goal 2: steps of the LoRA run (0: skip it)")
    parser.add_argument("--lora-upload", action="store_true",
                        help="goal 2: also time 1.5B-shaped adapter uploads to a real owner (writes a 3 GB base)")
    parser.add_argument("--json", type=Path, help="also write every raw figure here")
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    chosen_arms(args.arms)  # a typo fails here, not after an hour of runs
    if args.measure:
        print(json.dumps(measure(args.measure, args)))
        return 0
    goals = [int(g) for g in args.goals.split(",") if g.strip()]
    trees = {"now": ROOT} | ({"today": args.today.resolve()} if args.today else {})
    results: dict[str, dict[int, dict]] = {name: {} for name in trees}
    for goal in goals:  # both trees per goal, one after the other: the load they see is alike
        for name, tree in trees.items():
            print(f"goal {goal} in {name} ({tree}) ...", file=sys.stderr, flush=True)
            python = str(args.today_python) if name == "today" and args.today_python else PYTHON
            results[name][goal] = run_goal(goal, tree, args, python)
            if args.json:  # after every goal: a run cut short keeps what it measured
                args.json.write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    print(f"this tree: {ROOT} ({_commit(ROOT)}); today: {args.today or '-'}")
    for line in report(results):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    return 0 if all("error" not in r for tree in results.values() for r in tree.values()) else 1


def _commit(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                          text=True)
    return done.stdout.strip() or "not a git checkout"


if __name__ == "__main__":
    sys.exit(main())
