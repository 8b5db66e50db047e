"""The calibration cache: a restart with the same privacy targets skips calibration; anything
else (other targets, another accounting library, a damaged file) calibrates again."""

from __future__ import annotations

import json

import pytest

from target_owner_node import noise_cache
from target_owner_node.noise_cache import CACHE_FILE, cached_noise_multiplier, calibration_key

TARGETS = (8.0, 1e-6, 0.5, 150, "rdp")


class Calibrator:
    def __init__(self, value: float = 4.25):
        self.value, self.calls = value, 0

    def __call__(self, epsilon, delta, sample_rate, releases, accountant):
        self.calls += 1
        return self.value


def test_second_start_reads_the_cache(tmp_path):
    first = Calibrator()
    assert cached_noise_multiplier(tmp_path, *TARGETS, calibrate=first) == 4.25 and first.calls == 1
    record = json.loads((tmp_path / CACHE_FILE).read_text())
    assert record["key"] == calibration_key(*TARGETS) and record["key"]["opacus"] not in ("", None)

    def refuse(*args, **kwargs):
        raise AssertionError("calibrated although the cache matched")

    assert cached_noise_multiplier(tmp_path, *TARGETS, calibrate=refuse) == 4.25


@pytest.mark.parametrize("changed", [(4.0, 1e-6, 0.5, 150, "rdp"), (8.0, 1e-7, 0.5, 150, "rdp"),
                                     (8.0, 1e-6, 0.4, 150, "rdp"), (8.0, 1e-6, 0.5, 151, "rdp"),
                                     (8.0, 1e-6, 0.5, 150, "prv")])
def test_other_targets_calibrate_again(tmp_path, changed):
    cached_noise_multiplier(tmp_path, *TARGETS, calibrate=Calibrator())
    again = Calibrator(5.5)
    assert cached_noise_multiplier(tmp_path, *changed, calibrate=again) == 5.5 and again.calls == 1


def test_another_library_version_or_a_damaged_file_calibrates_again(tmp_path, monkeypatch):
    cached_noise_multiplier(tmp_path, *TARGETS, calibrate=Calibrator())
    monkeypatch.setattr(noise_cache.metadata, "version", lambda name: "0.0-other")
    again = Calibrator(3.0)
    assert cached_noise_multiplier(tmp_path, *TARGETS, calibrate=again) == 3.0 and again.calls == 1
    monkeypatch.undo()
    for damaged in ("{not json", json.dumps({"key": calibration_key(*TARGETS), "noise_multiplier": -1.0}),
                    json.dumps([1, 2])):
        (tmp_path / CACHE_FILE).write_text(damaged)
        fresh = Calibrator(2.0)
        assert cached_noise_multiplier(tmp_path, *TARGETS, calibrate=fresh) == 2.0 and fresh.calls == 1


def test_the_cached_value_is_the_real_calibration(tmp_path):
    from protocol.privacy.accountants import calibrate_noise_multiplier

    value = cached_noise_multiplier(tmp_path, 4.0, 1e-6, 0.1, 100, "rdp")
    assert value == pytest.approx(calibrate_noise_multiplier(4.0, 1e-6, 0.1, 100, accountant="rdp"))


def test_rows_per_query_is_cached_by_its_public_inputs_and_scipy_version(tmp_path, monkeypatch):
    from protocol.privacy.mechanisms import rows_per_query
    from target_owner_node.noise_cache import ROWS_CACHE_FILE, cached_rows_per_query, rows_key

    calls = []

    def compute(n, q, tail):
        calls.append((n, q, tail))
        return rows_per_query(n, q, tail)

    assert cached_rows_per_query(tmp_path, 180, 0.5, 1e-10, compute) == rows_per_query(180, 0.5, 1e-10)
    assert cached_rows_per_query(tmp_path, 180, 0.5, 1e-10, compute) == rows_per_query(180, 0.5, 1e-10)
    assert len(calls) == 1, "the second start reads the cache"
    assert json.loads((tmp_path / ROWS_CACHE_FILE).read_text())["key"] == rows_key(180, 0.5, 1e-10)
    cached_rows_per_query(tmp_path, 181, 0.5, 1e-10, compute)  # other inputs: computed again
    assert len(calls) == 2
    monkeypatch.setattr(noise_cache.metadata, "version", lambda name: "0.0-other")
    cached_rows_per_query(tmp_path, 181, 0.5, 1e-10, compute)  # another scipy: computed again
    assert len(calls) == 3


@pytest.mark.parametrize("damage", ["{", json.dumps({"key": None, "rows_per_query": 5}), "[]"])
def test_a_damaged_rows_cache_is_recomputed(tmp_path, damage):
    from protocol.privacy.mechanisms import rows_per_query
    from target_owner_node.noise_cache import ROWS_CACHE_FILE, cached_rows_per_query, rows_key

    (tmp_path / ROWS_CACHE_FILE).write_text(damage)
    assert cached_rows_per_query(tmp_path, 180, 0.5, 1e-10) == rows_per_query(180, 0.5, 1e-10)
    forged = {"key": rows_key(180, 0.5, 1e-10), "rows_per_query": 10_000}  # more rows than exist
    (tmp_path / ROWS_CACHE_FILE).write_text(json.dumps(forged))
    assert cached_rows_per_query(tmp_path, 180, 0.5, 1e-10) == rows_per_query(180, 0.5, 1e-10)


def test_a_cached_start_imports_neither_opacus_nor_scipy_stats(tmp_path, data_dir, pki):
    """Owner start-up <= 2 s (issue 14): the second open of a storage folder reads its calibration
    and rows_per_query from the caches, so the slow imports wait for the first release."""
    import subprocess
    import sys

    from tests.target_owner_node.conftest import config_dict, write_toml

    config_path = write_toml(tmp_path / "config.toml", config_dict(tmp_path, data_dir, pki))
    probe = ("import sys; from target_owner_node.config import load_config; from target_owner_node.node import open_node;"
             f"node = open_node(load_config({str(config_path)!r}), scorer=object());"
             "print(node.releases.rows_per_query, 'scipy.stats' in sys.modules, 'opacus' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    second = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert first[1:] == ["True", "True"], "the first start calibrates"
    assert second == [first[0], "False", "False"], "a cached start imports neither, and gets the same rows"
