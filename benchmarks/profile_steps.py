"""Where does a training step's time go? Data wait, forward+backward, optimiser step, plus a torch.profiler table.

    python benchmarks/profile_steps.py cfg.yaml [key=value ...]     (same keys as `tunesmith train`)
    PROFILE_STEPS=2 python benchmarks/profile_steps.py ...          (profile fewer of the last steps: a VLM step of
                                                                     8 micro-batches makes a large trace)
    PROFILE_TOTAL=12 python benchmarks/profile_steps.py ...         (run 12 optimiser steps instead of 48; the first
                                                                     third are warm-up, not timed)
    PROFILE_LOOP=1 python benchmarks/profile_steps.py ... save_final_model=false
                                                                    (the Runner's own loop, which queues step k
                                                                     before it reads step k-1: no phase timings,
                                                                     the profile and tokens/s of the last steps)
    PROFILE_LOOP=1 PROFILE_FIRST=1 ...                              (the same loop's first PROFILE_STEPS steps:
                                                                     what a process's first steps spend beyond
                                                                     the steady ones, host time first)

For vision/audio-language models the forward passes of the model's parts are profiled as ranges of their own
("part:<group>.<child>", e.g. part:vision_tower.patch_embed, part:vision_tower.blocks, part:projector.merger,
part:language_model), printed in a table of their own: CPU and GPU time spent inside each (backward excluded).
"""

from __future__ import annotations

import os
import sys
import time

import torch

from tunesmith.config.load import build_config, parse_cli_items
from tunesmith.train.setup import set_up
from tunesmith.train.steps import loss_fn, run_prepasses, step_stats


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def mark_parts(model) -> list:
    """A profiler range around the forward of each child of the family's vision/audio tower and projector, and of
    the language model (blocks of one ModuleList share a name); returns the hook handles."""
    from tunesmith.models.families import family_of
    from tunesmith.models.forward import base_model

    base = base_model(model)
    family = family_of(base.config)
    if family is None:
        return []
    modules = dict(base.named_modules())
    handles = []

    def ranged(module, name):
        def enter(*_):
            module._range = torch.profiler.record_function(name)
            module._range.__enter__()

        def leave(*_):
            module._range.__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))

    def blocks(module) -> list:  # the blocks of a ModuleList one by one (they have no forward of their own)
        return [] if module is None else list(module) if isinstance(module, torch.nn.ModuleList) else [module]

    for group in ("vision_tower", "audio_tower"):
        for path in getattr(family, group):
            parent = modules.get(path)
            for child, module in (parent.named_children() if parent is not None else ()):
                if f"{path}.{child}" in family.projector:
                    continue  # a projector inside the tower (Qwen-VL's merger) counts as the projector
                for block in blocks(module):
                    ranged(block, f"part:{group}.{child}")
    for path in family.projector:
        for block in blocks(modules.get(path)):
            ranged(block, f"part:projector.{path.rsplit('.', 1)[-1]}")
    for path in family.language_model:
        if path in modules and path != "lm_head":
            ranged(modules[path], "part:language_model")
    return handles


def _profiler():
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])


def profile_loop(runner, total: int, profiled: int, first: bool = False):
    """The Runner's own loop for `total` steps, the last `profiled` (the first, with `first`) under the profiler
    (pass save_final_model=false: the timing ends after the final save)."""
    runner.total_steps = profiled if first else total
    prof = _profiler()
    queue, seen = runner._queue_step, {"steps": 0, "tokens": 0, "start": None}

    def queued(step):
        seen["steps"] += 1
        if seen["steps"] == (1 if first else total - profiled + 1):
            _sync()
            prof.__enter__()
            seen["start"] = time.perf_counter()
        if seen["start"] is not None:
            seen["tokens"] += step.num_tokens
        return queue(step)

    runner._queue_step = queued
    runner.run()
    _sync()
    seconds = time.perf_counter() - seen["start"]
    prof.__exit__(None, None, None)
    print(f"the Runner's loop, {'first' if first else 'last'} {profiled} steps under the profiler: "
          f"{1e3 * seconds / profiled:.1f} ms a step; "
          f"{seen['tokens'] / profiled:.0f} tokens; {seen['tokens'] / seconds:.0f} tokens/s")
    return prof


def main() -> None:
    """Drives the Runner's engine and step source by hand, timing each part of PROFILE_TOTAL (48) optimiser steps."""
    yaml_path, overrides = parse_cli_items(sys.argv[1:])
    runner = set_up(build_config(yaml_path, {"overwrite_output_dir": True, **overrides}))
    engine, method, source = runner.engine, runner.method, runner.source
    mark_parts(engine.model)
    profiled = int(os.environ.get("PROFILE_STEPS", "8"))
    total = int(os.environ.get("PROFILE_TOTAL", "48"))
    if os.environ.get("PROFILE_LOOP") == "1":
        first = os.environ.get("PROFILE_FIRST") == "1"
        print_tables(profile_loop(runner, total, profiled, first), profiled, by_host=first)
        return
    warm_up = min(8, total // 3)
    waits, computes, steps, tokens = 0.0, 0.0, 0.0, 0
    for i in range(total):
        t0 = time.perf_counter()
        step = source.next_step(engine)
        t1 = time.perf_counter()
        if i == total - profiled:
            prof = _profiler()
            prof.__enter__()
        for update in step.updates:
            run_prepasses(engine, method, update)
            engine.forward_backward(update, loss_fn(method, step_stats(method, update)))
        _sync()
        t2 = time.perf_counter()
        engine.step()
        _sync()
        t3 = time.perf_counter()
        if i >= warm_up:
            waits, computes, steps, tokens = waits + t1 - t0, computes + t2 - t1, steps + t3 - t2, tokens + step.num_tokens
    prof.__exit__(None, None, None)
    n = total - warm_up
    print(f"per optimiser step over {n}: data wait {1e3 * waits / n:.1f} ms, forward+backward {1e3 * computes / n:.1f} ms, "
          f"optimiser {1e3 * steps / n:.1f} ms; {tokens / n:.0f} tokens; {tokens / (waits + computes + steps):.0f} tokens/s")
    print_tables(prof, profiled)


def print_tables(prof, profiled: int, by_host: bool = False) -> None:
    averages = prof.key_averages()
    # as the table's total, without "Command Buffer Full" (the host blocked on a full launch queue, no GPU work)
    kernels = [e for e in averages if e.device_type != torch.autograd.DeviceType.CPU and e.key != "Command Buffer Full"]
    busy = sum(e.self_device_time_total for e in kernels) / 1e3 / profiled
    print(f"GPU busy {busy:.1f} ms a step (kernel time; one stream, so no overlap)")
    parts = [e for e in averages if e.key.startswith("part:")]
    if parts:
        print(f"forward time of the model's parts over the last {profiled} steps (CPU / GPU inside each range, ms):")
        device_time = lambda e: getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0))  # noqa: E731
        for e in sorted(parts, key=lambda e: -e.cpu_time_total):
            print(f"  {e.key:<40} calls {e.count:>5}  cpu {e.cpu_time_total / 1e3:>9.1f}  gpu {device_time(e) / 1e3:>9.1f}")
    if by_host:  # first steps: where the host's time went, inclusive (a first call's loading sits in its op)
        print(averages.table(sort_by="cpu_time_total", row_limit=40))
    print(averages.table(sort_by="self_cuda_time_total", row_limit=25))
    print(averages.table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
