"""process_start: a run's start-up phase counts from the process's real start, not up to a second before it."""

import subprocess
import sys
import time

import pytest

from tunesmith.started import process_start


@pytest.mark.skipif(sys.platform != "linux", reason="read from /proc on Linux only")
def test_a_process_starts_after_it_is_launched_and_before_it_reads_its_start():
    launched = time.time()
    read = subprocess.run([sys.executable, "-c", "from tunesmith.started import process_start as p; "
                           "import time; print(p(), time.time())"], capture_output=True, text=True, check=True)
    started, now = map(float, read.stdout.split())
    tick = 0.011  # /proc counts a process's start in clock ticks (10 ms)
    assert launched - tick <= started <= now
    assert started - launched < 1.0  # the interpreter's start, not a boot time's fraction (psutil's error)


def test_this_process_started_before_now():
    assert process_start() < time.time()
