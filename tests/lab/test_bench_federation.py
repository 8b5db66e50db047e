"""The federation bench profile: L2RR on the aggregate vs uniform vs per-owner L2RR, matched seeds,
three owners per run (`simulate --owners 3`)."""

from pathlib import Path

from lab.bench.runner import simulate_command
from lab.bench.spec import load_profile, plan_runs


def test_the_federation_profile_compares_aggregate_uniform_and_per_owner_l2rr_on_matched_seeds():
    spec = load_profile("federation")
    runs = plan_runs(spec)
    assert {r.label for r in runs} == {"uniform", "l2rr_aggregate", "l2rr_owner0"}
    seeds = {label: sorted(r.seed for r in runs if r.label == label) for label in ("uniform", "l2rr_aggregate")}
    assert seeds["uniform"] == seeds["l2rr_aggregate"] == [0, 1, 2]
    by_label = {r.label: r for r in runs if r.seed == 0}
    assert by_label["l2rr_owner0"].config["owners"] == {"name": "per_owner", "owner": "owner0"}
    assert by_label["l2rr_aggregate"].config["owners"] == {"name": "heldout_size"}
    argv = simulate_command(by_label["l2rr_aggregate"], Path("run"), Path("c.toml"))
    assert argv[argv.index("--owners") + 1] == "3"
    assert by_label["uniform"].config_hash != by_label["l2rr_aggregate"].config_hash
