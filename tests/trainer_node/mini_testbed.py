"""A two-task testbed small enough for a train run of a few seconds (shared by the train tests)."""

MINI_TESTBED = """
name = "mini"
seed = 3
feedback_fraction = 0.5
[[source]]
task = "basic_arithmetic"
domain = "add"
size = 8
config = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, operators = ["+"] }
[[target]]
task = "basic_arithmetic"
domain = "add"
size = 4
config = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 2, operators = ["+"] }
"""


def mini_run_sections(tmp_path, model_line: str = "tiny = true") -> str:
    """The [model] .. [run] sections of a 3-step L2RR train run on mini.toml (before [feedback])."""
    return f"""
[model]
{model_line}
[data]
testbed = "mini.toml"
eval_size = 2
[policy]
name = "l2rr"
batch_size = 2
rollouts_per_prompt = 2
lookahead_max_clusters = 1
[rollout]
max_new_tokens = 4
[run]
steps = 3
out_dir = "{tmp_path / 'run'}"
"""
