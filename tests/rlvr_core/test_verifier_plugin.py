"""An organization's own verifier, installed from its own package (tests/rlvr_core/verifier_plugin) and
found through the entry-point group target_feedback.verifiers; its failures score 0 and never escape."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlvr_core.scoring import Decoding, score_rows
from rlvr_core.tasks.example import Example
from tests.plugin_install import PLUGIN_VERIFIERS, install_verifier_plugin, plugin_env, verifiers_from

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return install_verifier_plugin(tmp_path_factory.mktemp("plugin"))


def test_pip_installs_it_and_a_fresh_process_finds_its_verifiers(site):
    code = ("from rlvr_core.verifiers import verifier_names, get_verifier; from rlvr_core.tasks.example import Example;"
            "print(sorted(n for n in verifier_names() if n.startswith('acme')));"
            "print(get_verifier('acme_last_number').score('so it is 5', Example(id='a', prompt='p', answer='5')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=plugin_env(site, REPO), cwd=REPO, check=True)
    assert result.stdout.split("\n")[:2] == [str(list(PLUGIN_VERIFIERS)), "1.0"]


def test_the_registry_names_the_plugin_and_its_kind(site, monkeypatch):
    from rlvr_core.verifiers import VERIFIERS, verifier_names

    with verifiers_from(site, monkeypatch):
        assert set(PLUGIN_VERIFIERS) <= set(verifier_names())
        entry = VERIFIERS.entry("acme_last_number")
        assert entry.source.startswith("entry point acme_org_verifiers:")
        assert entry.value.info_kind == "VERIFIER_KIND_NAMED" and entry.value.name == "acme_last_number"


class Echo:
    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, prompts, num_samples, params, row_keys=None, shape=None):
        from types import SimpleNamespace

        return [[SimpleNamespace(text=self.text, encoded=True)] * num_samples for _ in prompts]


@pytest.mark.parametrize("completion", ["a guess", "exit now"])  # RuntimeError, then SystemExit
def test_a_failing_plugin_scores_zero_and_nothing_it_raises_escapes(site, monkeypatch, caplog, completion):
    with verifiers_from(site, monkeypatch):
        rows = [Example(id=f"r{i}", prompt=f"{i}?", answer=f"CANARY{i}", verifier="acme_fragile") for i in range(3)]
        rows.append(Example(id="ok", prompt="2+2?", answer="4", verifier="acme_last_number"))
        decoding = Decoding(max_new_tokens=2, samples_per_prompt=2, temperature=0.0, seed=0)
        with caplog.at_level("DEBUG"):
            scores = score_rows(Echo(completion + " 4"), rows, "{prompt}", decoding, [1, 2, 3, 4])
    np.testing.assert_array_equal(scores, [0.0, 0.0, 0.0, 1.0])
    assert "CANARY" not in caplog.text


def test_a_plugin_refuses_rows_it_can_never_score_at_load(site, monkeypatch, tmp_path):
    from rlvr_core.tasks.prompt_data import PromptDataError, PromptSetSpec, read_prompt_set

    with verifiers_from(site, monkeypatch):
        path = tmp_path / "p.jsonl"
        path.write_text('{"prompt": "2+2?", "answer": "four"}\n')
        spec = PromptSetSpec.model_validate({"path": str(path), "verifier": "acme_last_number"})
        with pytest.raises(PromptDataError, match="line 1: column 'answer': verifier 'acme_last_number'.*number"):
            read_prompt_set(spec)
