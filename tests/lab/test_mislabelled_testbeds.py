"""Testbeds where target feedback matters: wrong-label source clusters the trainer cannot see,
the oracle that samples clean skill clusters only, the generator, and the answer base rates."""

import copy
import json

import numpy as np
import pytest

from lab.base_rates import base_rates, commonest_answers, uncommon_examples
from lab.policies.oracle import OraclePolicy, fill_target_weights
from lab.testbeds import MislabelledCopy, dumps_testbed, mislabelled_variant, read_testbed_data
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.testbed import (
    TestbedError as BadTestbed,
)
from rlvr_core.tasks.testbed import (
    build_testbed_data,
    cluster_of,
    load_testbed,
    parse_testbed,
    skill_cluster_weights,
)
from trainer_node.cli import main
from trainer_node.config import DataConfig
from trainer_node.policies.base import SourcePool, StepRollouts, parse_policy_options
from trainer_node.training import load_source

HIDDEN = ("corrupt", "label_quality", "skill")


def _pool(testbed):
    """What the trainer's policy gets: build_training's SourcePool (load_source + cluster ids)."""
    source = load_source(DataConfig(testbed=testbed))
    examples = tuple(source.data.source)
    return SourcePool(examples=examples, clusters=tuple(source.cluster(e) for e in examples))


def _without_hidden_fields(data):
    """The same testbed with every hidden field removed but the copy kept RL-only (a label
    quality of "wrong" with no corruption): what a trainer would get if the labels were right."""
    stripped = copy.deepcopy(data)
    for entry in stripped["source"]:
        was_wrong = "corrupt" in entry
        for key in HIDDEN:
            entry.pop(key, None)
        if was_wrong:
            entry["label_quality"] = "wrong"
    return stripped


def test_the_mislabelled_testbed_shifts_only_its_harmful_cluster_and_keeps_the_defaults_start():
    base, variant = build_testbed_data(load_testbed("default")), build_testbed_data(load_testbed("mislabelled"))
    # same warm-up (so the same tiny policy and starting checkpoint) and the same target splits
    assert variant.warmup == base.warmup and variant.feedback == base.feedback and variant.test == base.test
    assert variant.source[: len(base.source)] == base.source
    crawl = [e for e in variant.source if cluster_of(e) == "crawl"]
    assert len(crawl) == 400  # all of the copy trains RL: no warm-up share
    clean = build_testbed_data(parse_testbed(_without_hidden_fields(read_testbed_data("mislabelled"))))
    truth = [e for e in clean.source if cluster_of(e) == "crawl"]
    assert [int(e.answer) for e in crawl] == [int(e.answer) + 1 for e in truth]
    assert [e.prompt for e in crawl] == [e.prompt for e in truth]


@pytest.mark.parametrize("testbed", ["mislabelled", "mislabelled_add", "mislabelled_mul"])
def test_the_trainer_sees_no_trace_of_label_quality(testbed):
    """The pool, its cluster ids and its examples equal those of the same testbed with every
    hidden field removed, except the corrupted answers; no field names the quality."""
    data = read_testbed_data(testbed)
    pool = _pool(testbed)
    clean = parse_testbed(_without_hidden_fields(data))
    clean_examples = build_testbed_data(clean).source
    assert pool.clusters == tuple(cluster_of(e) for e in clean_examples)
    assert len(pool.examples) == len(clean_examples)
    differing = [i for i, (a, b) in enumerate(zip(pool.examples, clean_examples)) if a != b]
    assert differing and all(pool.clusters[i] == "crawl" for i in differing)
    for i in differing:  # only the answer differs
        a, b = pool.examples[i], clean_examples[i]
        assert {k: v for k, v in vars(a).items() if k != "answer"} == {k: v for k, v in vars(b).items() if k != "answer"}
    # the prompts are natural text (a word list may hold "wrong"): look at every other field
    labels = [[e.id, e.task, e.domain, e.verifier, e.metadata["difficulty"], sorted(e.metadata),
               sorted(e.metadata["rg"])] for e in pool.examples]
    dumped = json.dumps(labels + list(pool.clusters)).lower()
    for word in ("wrong", "corrupt", "label_quality", "clean", "skill", "shift"):
        assert word not in dumped, word
    assert "crawl" in pool.cluster_names  # a neutral cluster id, like a data_source name


def test_the_oracle_samples_only_clean_skill_clusters():
    raw = fill_target_weights({"policy": {"name": "oracle"}, "data": {"testbed": "mislabelled"}})
    weights = raw["policy"]["cluster_weights"]
    assert raw["policy"].get("domain_weights") is None
    assert weights == pytest.approx({"count:easy": 1 / 3, "count:hard": 1 / 3, "count:medium": 1 / 3})
    pool = _pool("mislabelled")
    options = parse_policy_options({**raw["policy"], "batch_size": 64, "rollouts_per_prompt": 2})
    policy = OraclePolicy(pool, options, np.random.default_rng(0))
    seen = set()
    for step in range(5):
        seen |= {pool.clusters[r.index] for r in policy.next_requests(step, StepRollouts())}
    assert seen == {"count:easy", "count:medium", "count:hard"}
    # a testbed without hidden labels keeps the domain weights (the default's oracle is unchanged)
    default = fill_target_weights({"policy": {"name": "oracle"}, "data": {"testbed": "default"}})
    assert default["policy"]["domain_weights"] == {"count": 1.0} and "cluster_weights" not in default["policy"]


@pytest.mark.parametrize(("testbed", "skill"), [("mislabelled_add", "add"), ("mislabelled_mul", "mul")])
def test_the_arithmetic_testbeds_keep_their_skill_and_its_wrong_copy_on_the_same_prompts(testbed, skill):
    """mislabelled_add (sums) and mislabelled_mul (products): a target whose commonest answer is rare,
    the clean skill cluster, and `crawl` asking the same kind of question with every answer +1 (RL only:
    a clean warm-up)."""
    spec = load_testbed(testbed)
    data = build_testbed_data(spec)
    assert base_rates(data.test)["commonest_answer_accuracy"] < 0.2
    assert skill_cluster_weights(spec) == {skill: 1.0}
    seen = {e.prompt for e in data.source + data.warmup}
    assert not seen & {e.prompt for e in data.feedback + data.test}
    assert not any(cluster_of(e) == "crawl" for e in data.warmup)
    clean = build_testbed_data(parse_testbed(_without_hidden_fields(read_testbed_data(testbed))))
    wrong = [e for e in data.source if cluster_of(e) == "crawl"]
    truth = [e for e in clean.source if cluster_of(e) == "crawl"]
    assert [e.prompt for e in wrong] == [e.prompt for e in truth]
    assert [int(e.answer) for e in wrong] == [int(e.answer) + 1 for e in truth]


def test_the_oracle_refuses_both_or_neither_weighting():
    pool = _pool("mislabelled")
    with pytest.raises(ValueError, match="exactly one"):
        OraclePolicy(pool, parse_policy_options({"name": "oracle"}), np.random.default_rng(0))
    both = parse_policy_options({"name": "oracle", "domain_weights": {"count": 1.0}, "cluster_weights": {"crawl": 1.0}})
    with pytest.raises(ValueError, match="exactly one"):
        OraclePolicy(pool, both, np.random.default_rng(0))
    with pytest.raises(ValueError, match="cluster_weights' names clusters not in the pool"):
        OraclePolicy(pool, parse_policy_options({"name": "oracle", "cluster_weights": {"x": 1.0}}),
                     np.random.default_rng(0))


def _default_data():
    return copy.deepcopy(read_testbed_data("default"))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["target"][0].update(corrupt={"kind": "shift", "by": 1}), "source entries only"),
    (lambda d: d["target"][0].update(skill="count"), "source entries only"),
    (lambda d: d["source"][0].update(corrupt={"kind": "shift", "by": 1}, label_quality="clean"), "is 'clean' but"),
    (lambda d: d["source"][0].update(corrupt={"kind": "shift", "by": 0}), "must not be 0"),
    (lambda d: d["source"][0].update(corrupt={"kind": "swap"}), "corrupt.kind"),
    (lambda d: d["source"].append({**d["source"][1], "corrupt": {"kind": "shift", "by": 1}}), "cluster 'count:medium'"),
])
def test_bad_label_fields_name_the_field(edit, message):
    data = _default_data()
    edit(data)
    with pytest.raises(BadTestbed, match=message):
        parse_testbed(data)


def test_a_shift_of_non_integer_answers_fails_at_build_naming_the_entry():
    data = _default_data()
    spell = next(i for i, e in enumerate(data["source"]) if e["task"] == "spell_backward")
    data["source"][spell]["corrupt"] = {"kind": "shift", "by": 1}
    with pytest.raises(BadTestbed, match=rf"source\[{spell}\]\.corrupt: kind 'shift' needs integer answers"):
        build_testbed_data(parse_testbed(data))


def test_skill_clusters_need_a_clean_carrier():
    data = _default_data()
    for entry in data["source"]:
        if entry["domain"] == "count":
            entry["label_quality"] = "wrong"
    with pytest.raises(BadTestbed, match="no clean source entry carries the target skill"):
        skill_cluster_weights(parse_testbed(data))


def test_the_generator_reproduces_the_committed_testbed(tmp_path):
    generated = mislabelled_variant("default", [MislabelledCopy("count:medium", 1, "crawl")], "mislabelled")
    committed = read_testbed_data("mislabelled")
    assert generated["source"] == committed["source"] and generated["target"] == committed["target"]
    with pytest.raises(BadTestbed, match="no source cluster of that id"):
        mislabelled_variant("default", [MislabelledCopy("count:nope", 1, "crawl")], "x")
    out = tmp_path / "two.toml"
    assert main(["testbed", "mislabel", "--copy", "count:medium", "--copy", "add=100", "--by", "1", "--by", "10",
                 "--as", "webA", "--as", "webB", "--name", "two", "--out", str(out)]) == 0
    spec = load_testbed(out)
    wrong = [e for e in spec.source if e.quality == "wrong"]
    assert [(e.domain, e.corrupt.by, e.skill_name, e.size) for e in wrong] == [("webA", 1, "count", 400),
                                                                               ("webB", 10, "add", 100)]
    assert dumps_testbed(read_testbed_data(out)) == out.read_text()


def _example(i, answer, domain="count"):
    return Example(id=f"t{i}", prompt=f"q{i}", answer=answer, task="letter_counting", domain=domain,
                   verifier="reasoning_gym", metadata={"rg": {}})


def test_base_rates_of_a_test_split():
    test = [_example(0, "1"), _example(1, "1"), _example(2, "2"), _example(3, "3"), _example(4, "7", "other")]
    assert commonest_answers(test) == {"count": "1", "other": "7"}
    assert [e.id for e in uncommon_examples(test)] == ["t2", "t3"]
    rates = base_rates(test)
    assert rates["commonest_answer_accuracy"] == pytest.approx(3 / 5)  # two "1"s and the lone "7"
    assert rates["per_domain"]["count"] == {"answer": "1", "accuracy": 0.5, "n": 4}
    assert rates["n"] == 5 and rates["uncommon_n"] == 2


def test_the_default_testbeds_plateau_is_its_answer_base_rate():
    """Always answering "1" scores 61.2% on the default test split: the ~61% every method reached."""
    rates = base_rates(build_testbed_data(load_testbed("default")).test)
    assert rates["per_domain"]["count"]["answer"] == "1"
    assert rates["commonest_answer_accuracy"] == pytest.approx(0.612, abs=0.001)


def test_the_balanced_testbed_is_generated_and_its_commonest_answer_scores_its_share(tmp_path, capsys):
    """mislabelled_balanced: the mislabelled testbed with the count target capped at 25% per
    answer. Always answering the commonest answer scores 25.0% of its test split (61.2% on the
    mislabelled one), with the mislabelled testbed's source and warm-up, so the same start."""
    generated = mislabelled_variant("default", [MislabelledCopy("count:medium", 1, "crawl")], "mislabelled_balanced",
                                    max_answer_share=0.25)
    committed = read_testbed_data("mislabelled_balanced")
    assert generated["source"] == committed["source"] and generated["target"] == committed["target"]
    assert committed["source"] == read_testbed_data("mislabelled")["source"]
    balanced, mislabelled = (build_testbed_data(load_testbed(name)) for name in ("mislabelled_balanced", "mislabelled"))
    assert balanced.source == mislabelled.source and balanced.warmup == mislabelled.warmup
    rates = base_rates(balanced.test)
    assert rates["n"] == 420 and rates["commonest_answer_accuracy"] <= 0.25 + 1 / 420
    assert rates["commonest_answer_accuracy"] == pytest.approx(0.250, abs=0.001)
    assert base_rates(balanced.feedback)["commonest_answer_accuracy"] <= 0.25 + 1 / 180
    with pytest.raises(BadTestbed, match=r"target\[0\]\.max_answer_share: 0\.1 is not reachable"):
        mislabelled_variant("default", [MislabelledCopy("count:medium", 1, "crawl")], "x", max_answer_share=0.1)
    out = tmp_path / "b.toml"
    args = ["testbed", "mislabel", "--copy", "count:medium", "--as", "crawl", "--name", "mislabelled_balanced"]
    assert main([*args, "--max-answer-share", "0.25", "--out", str(out)]) == 0
    assert read_testbed_data(out)["target"] == committed["target"]
    assert main([*args, "--max-answer-share", "0.1", "--out", str(tmp_path / "c.toml")]) == 2
    assert "max_answer_share: 0.1 is not reachable" in capsys.readouterr().out and not (tmp_path / "c.toml").exists()


def test_the_ablations_profile_runs_are_the_full_profiles_runs():
    """`mislabelled_ablations` is a slice of `mislabelled`: same labels, same run configs, so one
    --out shares the runs (the bench reuses them by config hash)."""
    from lab.bench.spec import load_profile, run_config

    full, part = load_profile("mislabelled"), load_profile("mislabelled_ablations")
    rows = {m.label: m for m in full.methods}
    assert part.seeds == full.seeds and part.steps == full.steps and part.testbeds == full.testbeds
    assert {m.label for m in part.methods} == {"uniform", "l2rr", "l2rr-no-waste", "l2rr-no-allocation",
                                               "l2rr-uniform-q", "target-mix"}
    for method in part.methods:
        assert run_config(part, method, "mislabelled", 5) == run_config(full, rows[method.label], "mislabelled", 5)
