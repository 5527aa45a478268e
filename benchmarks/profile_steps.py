"""Where does a training step's time go? Data wait, forward+backward, optimiser step, plus a torch.profiler table.

    python benchmarks/profile_steps.py cfg.yaml [key=value ...]     (same keys as `tunesmith train`)
"""

from __future__ import annotations

import sys
import time

import torch

from tunesmith.config.load import build_config, parse_cli_items
from tunesmith.train.setup import set_up
from tunesmith.train.steps import loss_fn, run_prepasses, step_stats


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    """Drives the Runner's engine and step source by hand, timing each part of 48 optimiser steps."""
    yaml_path, overrides = parse_cli_items(sys.argv[1:])
    runner = set_up(build_config(yaml_path, {"overwrite_output_dir": True, **overrides}))
    engine, method, source = runner.engine, runner.method, runner.source
    waits, computes, steps, tokens = 0.0, 0.0, 0.0, 0
    for i in range(48):
        t0 = time.perf_counter()
        step = source.next_step(engine)
        t1 = time.perf_counter()
        if i == 40:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        for update in step.updates:
            run_prepasses(engine, method, update)
            engine.forward_backward(update, loss_fn(method, step_stats(method, update)))
        _sync()
        t2 = time.perf_counter()
        engine.step()
        _sync()
        t3 = time.perf_counter()
        if i >= 8:  # skip warm-up
            waits, computes, steps, tokens = waits + t1 - t0, computes + t2 - t1, steps + t3 - t2, tokens + step.num_tokens
    prof.__exit__(None, None, None)
    n = 40
    print(f"per optimiser step over {n}: data wait {1e3 * waits / n:.1f} ms, forward+backward {1e3 * computes / n:.1f} ms, "
          f"optimiser {1e3 * steps / n:.1f} ms; {tokens / n:.0f} tokens; {tokens / (waits + computes + steps):.0f} tokens/s")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
