"""When this process started, on the wall clock: a run's start-up phase counts from there (imports included).

psutil's create_time adds the process's start (clock ticks since boot) to the boot time that /proc/stat gives in
whole seconds, rounded down: the start comes out early by the fraction of a second the machine booted at, the same
for every process on one machine and different on the next (0.05-1.0 s on the device machines of 2026-12-04..06,
where a run's phases then added up to more than its wall-clock time). Here the start in ticks is set against the
boot clock read now, which leaves only the tick (10 ms) of error.
"""

from __future__ import annotations

import os
import sys
import time


def process_start() -> float:
    """This process's start as a time.time() value (Linux: to the clock tick; elsewhere psutil's create_time)."""
    if sys.platform != "linux":
        import psutil

        return psutil.Process().create_time()
    with open("/proc/self/stat") as stat:
        after_name = stat.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    ticks = int(after_name[19])  # field 22, starttime; after_name[0] is field 3
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start
