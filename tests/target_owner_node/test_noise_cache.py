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
