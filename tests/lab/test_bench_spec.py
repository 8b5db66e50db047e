import tomllib

import pytest

from lab.bench import tomlwrite
from lab.bench.spec import BenchSpecError, load_profile, load_spec, parse_spec, plan_runs

BASE = {"seeds": [0, 1], "steps": 4, "methods": [{"label": "uniform", "policy": "uniform"},
                                                  {"label": "l2rr", "policy": "l2rr"}]}


def spec_with(**changes):
    raw = {**BASE, **changes}
    return parse_spec(raw, source="test.toml")


@pytest.mark.parametrize("changes, field", [
    ({"methods": [{"label": "uniform", "policy": "uniformm"}]}, "methods[0].policy"),
    ({"methods": [{"label": "uniform", "policy": "uniform", "optoins": {}}]}, "methods[0].optoins"),
    ({"methods": [{"label": "a b", "policy": "uniform"}], "control": "a b"}, "methods[0].label"),
    ({"control": "dapo"}, "control"),
    ({"seeds": [1, 1]}, "seeds"),
    ({"seeds": []}, "seeds"),
    ({"steps": 0}, "steps"),
    ({"methods": [{"label": "uniform", "policy": "uniform", "epsilon": 0}]}, "methods[0].epsilon"),
    ({"methods": [{"label": "uniform", "policy": "uniform", "no_dp": "yes please"}]}, "methods[0].no_dp"),
    ({"testbeds": ["no-such-testbed"]}, "testbeds"),
    ({"workers": 0}, "workers"),
    ({"config": {"run": {"seed": 3}}}, "config"),
    ({"methods": [{"label": "uniform", "policy": "uniform", "group": "sweep"}]}, "methods[0]"),
    ({"methods": [{"label": "uniform", "policy": "uniform"}, {"label": "uniform", "policy": "dapo"}]}, "methods"),
    ({"stpes": 3}, "stpes"),
])
def test_spec_errors_name_the_field(changes, field):
    with pytest.raises(BenchSpecError) as error:
        spec_with(**changes)
    assert f"  {field}:" in str(error.value), str(error.value)


def test_missing_required_field_is_named():
    with pytest.raises(BenchSpecError, match="  steps: required"):
        parse_spec({"seeds": [0], "methods": [{"label": "uniform", "policy": "uniform"}]})


def test_bad_simulate_override_is_caught_when_planning_and_names_method_and_field():
    spec = spec_with(methods=[{"label": "uniform", "policy": "uniform"},
                              {"label": "fast", "policy": "l2rr", "config": {"grpo": {"lr": -1}}}])
    with pytest.raises(BenchSpecError, match=r"(?s)methods\[1\] \(fast\).*\n  grpo\.lr: "):
        plan_runs(spec)


def test_a_policy_option_typo_fails_when_the_spec_loads_naming_method_and_option():
    with pytest.raises(BenchSpecError) as error:
        spec_with(methods=[{"label": "uniform", "policy": "uniform"},
                           {"label": "l2rr", "policy": "l2rr", "options": {"lamda_waste": 0.5}}])
    assert "  methods[1].options.lamda_waste: not an option of data policy 'l2rr'; did you mean 'lambda_waste'?" in str(
        error.value)
    with pytest.raises(BenchSpecError, match=r"methods\[0\]\.options\.eta_q: Input should be a valid number"):
        spec_with(methods=[{"label": "l2rr", "policy": "l2rr", "options": {"eta_q": True}}], control="l2rr")


def test_plan_time_validation_catches_a_policy_option_typo():
    from lab.bench.spec import BenchSpec, MethodSpec

    # Built without validation (as a spec edited after loading could be): planning still refuses it.
    typo = MethodSpec.model_construct(label="l2rr", policy="l2rr", options={"lamda_waste": 0.5}, config={},
                                      group="main")
    spec = BenchSpec.model_construct(**{**spec_with().__dict__, "methods": [spec_with().methods[0], typo]})
    with pytest.raises(BenchSpecError, match=r"(?s)methods\[1\] \(l2rr\).*policy\.lamda_waste: not an option"):
        plan_runs(spec)
    shared = spec_with(config={"policy": {"batch_size": 0}})  # the shared batch shape may come from `config`
    with pytest.raises(BenchSpecError, match=r"policy\.batch_size: Input should be greater than 0"):
        plan_runs(shared)


@pytest.mark.parametrize(("config", "field"), [
    ({"rollout": {"options": {"batch_sise": 4}}}, r"rollout\.options\.batch_sise: not an option of engine"),
    ({"model": {"tiny_spec": {"hiden_size": 64}}}, r"model\.tiny_spec\.hiden_size: unknown setting"),
])
def test_plan_time_validation_catches_engine_and_tiny_spec_typos(config, field):
    spec = spec_with(methods=[{"label": "uniform", "policy": "uniform", "config": config}], control="uniform")
    with pytest.raises(BenchSpecError, match=r"(?s)methods\[0\] \(uniform\).*" + field):
        plan_runs(spec)


def test_method_options_become_policy_fields_and_config_may_set_only_the_batch_shape():
    spec = spec_with(config={"policy": {"batch_size": 4}},
                     methods=[{"label": "uniform", "policy": "uniform"},
                              {"label": "l2rr", "policy": "l2rr", "options": {"lambda_waste": 1.0}}])
    configs = {r.label: r.config["policy"] for r in plan_runs(spec)}
    assert configs["l2rr"] == {"batch_size": 4, "rollouts_per_prompt": 8, "name": "l2rr", "lambda_waste": 1.0}
    assert configs["uniform"] == {"batch_size": 4, "rollouts_per_prompt": 8, "name": "uniform"}
    with pytest.raises(BenchSpecError, match=r"config: .*policy\.lambda_waste is an option of one policy"):
        spec_with(config={"policy": {"lambda_waste": 1.0}})
    with pytest.raises(BenchSpecError, match=r"methods\[0\]\.options: `name` is the method's `policy`"):
        spec_with(methods=[{"label": "uniform", "policy": "uniform", "options": {"name": "dapo"}}])


def test_load_spec_reports_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(BenchSpecError, match="does not exist"):
        load_spec(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("seeds = [0,\n")
    with pytest.raises(BenchSpecError, match="not valid TOML"):
        load_spec(bad)


def test_every_method_gets_exactly_the_same_seeds_and_testbeds():
    spec = spec_with(seeds=[3, 1, 7], testbeds=["default", "small"],
                     methods=[{"label": "uniform", "policy": "uniform"}, {"label": "dapo", "policy": "dapo"},
                              {"label": "l2rr-x", "policy": "l2rr", "options": {"lambda_waste": 1.0}}])
    runs = plan_runs(spec)
    assert len(runs) == 3 * 3 * 2
    cells = {label: sorted((r.testbed, r.seed) for r in runs if r.label == label) for label in ("uniform", "dapo", "l2rr-x")}
    assert cells["uniform"] == cells["dapo"] == cells["l2rr-x"] == sorted((t, s) for t in ("default", "small") for s in (1, 3, 7))
    for run in runs:  # the seed reaches the simulate config, which seeds the policy rng and data order
        assert run.config["run"]["seed"] == run.seed and run.config["data"]["testbed"] == run.testbed
        assert run.config["policy"]["name"] == run.policy and "out_dir" not in run.config["run"]
    assert len({r.run_id for r in runs}) == len(runs)


def test_config_hash_changes_with_options_and_not_with_anything_else_planned_the_same():
    first = plan_runs(spec_with())
    again = plan_runs(spec_with())
    assert [r.config_hash for r in first] == [r.config_hash for r in again]
    changed = plan_runs(spec_with(methods=[{"label": "uniform", "policy": "uniform"},
                                           {"label": "l2rr", "policy": "l2rr", "options": {"lambda_waste": 0.1}}]))
    for old, new in zip(first, changed, strict=True):
        assert (old.config_hash == new.config_hash) == (old.label == "uniform")


def test_a_method_may_turn_dp_off_for_its_own_rows_and_the_hash_sees_it():
    spec = spec_with(methods=[{"label": "l2rr", "policy": "l2rr"},
                              {"label": "l2rr-nodp", "policy": "l2rr", "no_dp": True}], control="l2rr")
    runs = {(r.label, r.seed): r for r in plan_runs(spec)}
    seed = spec.seeds[0]
    assert runs[("l2rr", seed)].no_dp is False and runs[("l2rr-nodp", seed)].no_dp is True
    assert runs[("l2rr", seed)].config == runs[("l2rr-nodp", seed)].config
    assert runs[("l2rr", seed)].config_hash != runs[("l2rr-nodp", seed)].config_hash
    everywhere = {r.label: r.no_dp for r in plan_runs(spec_with(no_dp=True, methods=[
        {"label": "uniform", "policy": "uniform"}, {"label": "l2rr-dp", "policy": "l2rr", "no_dp": False}]))}
    assert everywhere == {"uniform": True, "l2rr-dp": False}  # the method's choice wins over the spec's
    budgets = {r.label: r.epsilon for r in plan_runs(spec_with(epsilon=8.0, methods=[
        {"label": "l2rr", "policy": "l2rr"}, {"label": "l2rr-eps1", "policy": "l2rr", "epsilon": 1.0}], control="l2rr"))}
    assert budgets == {"l2rr": 8.0, "l2rr-eps1": 1.0}


def test_config_overrides_merge_with_method_winning():
    spec = spec_with(config={"run": {"eval_every": 2}, "grpo": {"lr": 1e-4}},
                     methods=[{"label": "uniform", "policy": "uniform", "config": {"grpo": {"lr": 5e-4}}}],
                     control="uniform")
    config = plan_runs(spec)[0].config
    assert config["run"]["eval_every"] == 2 and config["grpo"]["lr"] == 5e-4
    assert config["model"]["tiny"] is True  # simulate defaults kept


def test_run_config_round_trips_through_the_toml_writer():
    spec = spec_with(methods=[{"label": "l2rr", "policy": "l2rr", "options": {"lambda_waste": 0.05, "estimator": "spsa",
                                                                            "learn_q": False}}], control="l2rr")
    config = plan_runs(spec)[0].config
    assert tomllib.loads(tomlwrite.dumps(config)) == config


def test_builtin_profiles_are_valid_and_sized_as_promised():
    quick, full = load_profile("quick"), load_profile("full")
    assert [m.label for m in quick.methods] == ["uniform", "dapo", "l2rr"] and len(quick.seeds) == 3
    assert len(plan_runs(quick)) == 9
    assert len(full.seeds) == 12 and full.control == "uniform"
    labels = {m.label: m for m in full.methods}
    assert {"uniform", "dapo", "greso", "ar3po", "l2rr"} <= {m.label for m in full.methods if m.group == "main"}
    ablations = [m.options for m in full.methods if m.group == "ablation"]
    assert {"waste_penalty": False} in ablations and {"rollout_allocation": False} in ablations
    assert {"learn_q": False} in ablations
    assert labels["l2rr"].options == {}
    assert len(plan_runs(full)) == 12 * 8
    sweep = load_profile("sweep")
    assert sorted(m.options["lambda_waste"] for m in sweep.methods if m.group == "sweep") == [0.05, 0.5, 1.0]
    diagnostics = {m.label: m for m in load_profile("diagnostics").methods}
    assert diagnostics["l2rr-spsa"].options == {"estimator": "spsa"}
    assert diagnostics["target-mix"].config == {"data": {"train_on_feedback_split": True}}
    assert diagnostics["uniform-select"].config == {"selection": {"every": 10}}
    oracle_run = next(r for r in plan_runs(load_profile("diagnostics")) if r.label == "oracle")
    assert oracle_run.config["policy"]["domain_weights"] == {"count": 1.0}  # filled as simulate does
    staleness = load_profile("staleness")  # issue 14: asynchronous against synchronous feedback, paired
    assert {m.label: m.options for m in staleness.methods} == {"l2rr-sync": {"max_staleness": 0},
                                                               "l2rr-async": {"max_staleness": 16, "fixed_staleness": False},
                                                               "l2rr-async8": {"max_staleness": 8,
                                                                               "fixed_staleness": False}}
    assert staleness.control == "l2rr-sync" and len(plan_runs(staleness)) == 18
    fixed = load_profile("staleness_fixed")  # the same, with each release applied exactly at its bound
    assert {m.label: m.options for m in fixed.methods} == {
        "l2rr-sync": {"max_staleness": 0},
        "l2rr-fixed16": {"max_staleness": 16, "fixed_staleness": True},
        "l2rr-fixed8": {"max_staleness": 8, "fixed_staleness": True}}
    assert fixed.control == "l2rr-sync" and len(plan_runs(fixed)) == 36
    with pytest.raises(BenchSpecError, match="unknown profile"):
        load_profile("huge")


def test_toml_writer_leaves_out_none_and_quotes_odd_keys():
    text = tomlwrite.dumps({"policy": {"name": "l2rr", "options": {"a b": 1, "x": [1.5, True]}, "gone": None}})
    assert tomllib.loads(text) == {"policy": {"name": "l2rr", "options": {"a b": 1, "x": [1.5, True]}}}
