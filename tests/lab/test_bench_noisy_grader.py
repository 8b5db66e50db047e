"""The noisy-grader bench profiles (issue 19): the rows the issue asks for, 12 matched seeds,
SetGRPO and its ablations selected through the method entries' `coefficients`."""

from __future__ import annotations

import pytest

from lab.bench.spec import BenchSpecError, load_profile, parse_spec, run_config

ROWS = {"grpo_exact", "grpo_noisy", "setgrpo", "setgrpo_sphere", "setgrpo_identity", "setgrpo_anchor",
        "l2rr_owner_exact", "l2rr_owner_noisy"}


@pytest.mark.parametrize("name,seeds", [("noisy_grader", 12), ("noisy_grader_short", 3)])
def test_profile_rows_and_seeds(name, seeds):
    spec = load_profile(name)
    assert len(spec.seeds) == seeds and spec.testbeds == ["noisy"] and spec.control == "grpo_noisy"
    methods = {m.label: m for m in spec.methods}
    assert set(methods) == ROWS
    exact = run_config(spec, methods["grpo_exact"], "noisy", 0)
    assert exact["data"]["grader"] == "exact" and "coefficients" not in exact["grpo"]
    ablations = {label: run_config(spec, methods[label], "noisy", 0)["grpo"]["coefficients"]
                 for label in ("setgrpo_sphere", "setgrpo_identity", "setgrpo_anchor")}
    assert ablations["setgrpo_sphere"]["set_shape"] == "sphere"
    assert ablations["setgrpo_identity"]["geometry"] == "identity"
    assert ablations["setgrpo_anchor"]["recovery"] == "anchor_only"


def test_a_bad_coefficient_option_in_a_method_names_the_field():
    with pytest.raises(BenchSpecError, match=r"coefficients\.bta"):
        parse_spec({"name": "x", "seeds": [0], "testbeds": ["noisy"], "steps": 1, "control": "a",
                    "methods": [{"label": "a"}, {"label": "b", "coefficients": {"name": "setgrpo", "bta": 1}}]})
    with pytest.raises(BenchSpecError, match="grpo.coefficients"):
        parse_spec({"name": "x", "seeds": [0], "testbeds": ["noisy"], "steps": 1, "control": "a",
                    "methods": [{"label": "a", "config": {"grpo": {"coefficients": "setgrpo"}}}]})


def test_the_complete_flip30_profile_shares_its_grpo_rows_and_runs_setgrpo_with_point_fallback():
    from trainer_node.config import TrainConfig

    full, screen = load_profile("noisy_grader_flip30_point"), load_profile("noisy_grader_flip30")
    assert len(full.seeds) == 12 and full.control == "grpo_flip30"
    rows = {m.label: m for m in full.methods}
    assert set(rows) == {"grpo_exact", "grpo_flip30", "grpo_flip30_draw_mean", "setgrpo_point", "setgrpo_point_sphere",
                         "setgrpo_point_identity", "setgrpo_point_anchor", "l2rr_owner_exact", "l2rr_owner_noisy"}
    old = {m.label: m for m in screen.methods}
    for label in ("grpo_exact", "grpo_flip30"):  # same config: the 12 runs each are reused
        assert run_config(full, rows[label], "noisy", 3) == run_config(screen, old[label], "noisy", 3)
    for label in ("setgrpo_point", "setgrpo_point_sphere", "setgrpo_point_identity", "setgrpo_point_anchor"):
        config = TrainConfig.model_validate(run_config(full, rows[label], "noisy", 0))
        assert config.grpo.coefficients.rejected == "point"
    assert TrainConfig.model_validate(run_config(screen, old["setgrpo"], "noisy", 0)).grpo.coefficients.rejected == "skip"
    mean = TrainConfig.model_validate(run_config(full, rows["grpo_flip30_draw_mean"], "noisy", 0)).grpo.coefficients
    assert (mean.name, mean.draws) == ("draw_mean", 2)
    noisy_owner = run_config(full, rows["l2rr_owner_noisy"], "noisy", 0)
    assert noisy_owner["simulated_owner"]["feedback_verifier"]["flip_rate"] == 0.3
    assert "simulated_owner" not in run_config(full, rows["l2rr_owner_exact"], "noisy", 0)
