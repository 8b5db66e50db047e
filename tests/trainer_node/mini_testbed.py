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
