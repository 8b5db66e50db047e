"""keep_freed_memory: glibc's thresholds are raised where there is glibc; a bad size names itself."""

from __future__ import annotations

import platform
import sys

import pytest

from rlvr_core.models.memory import keep_freed_memory


def test_a_size_below_one_byte_is_refused():
    with pytest.raises(ValueError, match="keep_bytes must be >= 1"):
        keep_freed_memory(0)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds():
    assert keep_freed_memory() is True
    assert keep_freed_memory(64 << 20) is True  # the call may repeat; the last one holds
    assert keep_freed_memory() is True
