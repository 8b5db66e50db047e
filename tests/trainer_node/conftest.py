"""Fixtures of the train tests that talk to real in-process owners: two organizations' PKI
(ours and a stranger's) and a held-out data folder, built once per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.conftest import heldout_examples, make_two_orgs


@pytest.fixture(scope="module")
def orgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("orgs")
    return make_two_orgs(root / "ours"), make_two_orgs(root / "theirs")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from rlvr_core.tasks.io import write_examples

    root = tmp_path_factory.mktemp("data")
    write_examples(root / "heldout.jsonl", heldout_examples())
    return root
