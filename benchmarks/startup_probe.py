"""Where a training run's time outside training goes: a timeline of set-up's steps, and the imports by cost.

    python benchmarks/startup_probe.py timeline cfg.yaml [key=value ...]   # one run, its steps' times on stdout
    python benchmarks/startup_probe.py imports cfg.yaml [key=value ...]    # one run under -X importtime

`timeline` runs `tunesmith train` in this process with set-up's steps wrapped (names below), and prints each step's
start and end in seconds since the process was created (what the run's start-up phase counts from). `imports` runs
the command as a child under `python -X importtime` and prints the modules imported at the top level by cumulative
time, and the costliest modules by their own time, with the chain that imported each. Both leave the run's own
phases in its train_summary.json. Use max_steps=2 save_final_model=false for the start-up alone.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time

from tunesmith.started import process_start

STARTED = process_start()
# set-up's steps, as train/setup.py calls them (module globals, so wrapping them there times every call)
SETUP_STEPS = ("resolve", "run_facts", "prepare_output_dir", "seed_everything", "select_flash_kernels",
               "load_preprocessing", "_use_chat_template", "prepare_data", "print_data_report", "resolve_steps",
               "checkpoint_layers", "import_liger", "build_engine", "_step_source", "Runner")


def _stamp() -> float:
    return time.time() - STARTED


def _timed(name, fn, events):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        begin = _stamp()
        try:
            return fn(*args, **kwargs)
        finally:
            events.append((name, begin, _stamp()))
    return wrapper


def timeline(argv: list[str]) -> None:
    events = [("interpreter and this script", 0.0, _stamp())]
    begin = _stamp()
    from tunesmith import cli, prefetch

    try:
        from tunesmith import import_memo  # trees before it had none
    except ImportError:
        import_memo = None
    if import_memo is not None:
        import_memo.install()  # as `tunesmith train` does, before its imports
    try:
        from tunesmith import collector  # trees before it had none
    except ImportError:
        collector = None
    if collector is not None:
        collector.pause()
    prefetch.start()
    cli._setup_logging()
    events.append(("import cli, logging set-up (torch, datasets, transformers' utils)", begin, _stamp()))
    begin = _stamp()
    from tunesmith.train import runner, setup

    events.append(("import tunesmith.train.setup", begin, _stamp()))
    for name in SETUP_STEPS:  # those of this tree (an older one prepared data in-process: prepare_data)
        if hasattr(setup, name):
            setattr(setup, name, _timed(name, getattr(setup, name), events))
    setup.prefetch.finish = _timed("prefetch.finish (waits for the side thread)", prefetch.finish, events)
    if hasattr(setup, "PreparingData"):
        setup.PreparingData.result = _timed("PreparingData.result (waits for the data)", setup.PreparingData.result,
                                            events)
    runner.Runner._finish = _timed("Runner._finish (final save)", runner.Runner._finish, events)
    begin = _stamp()
    built = cli._config_from(argv)
    events.append(("build_config", begin, _stamp()))
    r = setup.set_up(built)
    begin = _stamp()
    r.run()
    events.append(("Runner.run", begin, _stamp()))
    for name, start, end in sorted(events, key=lambda e: e[1]):
        print(f"{start:8.2f} {end:8.2f} {end - start:7.2f}  {name}")
    sys.stdout.flush()


def _parse(stderr: str) -> list[tuple[int, int, int, str]]:
    """(depth, self us, cumulative us, module) of each line of -X importtime's report, in its order."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:"):].split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        rows.append((depth, int(self_us), int(cumulative_us), name.strip()))
    return rows


def _importers(rows) -> dict[str, str]:
    """Each module's importer: -X importtime writes a module after the ones it imports, one level deeper."""
    parent, pending = {}, {}
    for depth, _, _, name in rows:
        for child in pending.pop(depth + 1, []):
            parent[child] = name
        pending.setdefault(depth, []).append(name)
    return parent


def imports(argv: list[str], top: int = 30) -> None:
    command = [sys.executable, "-X", "importtime", "-m", "tunesmith", "train", *argv]
    done = subprocess.run(command, capture_output=True, text=True)
    rows = _parse(done.stderr)
    parent = _importers(rows)
    print(f"rc {done.returncode}; {len(rows)} modules, {sum(r[1] for r in rows) / 1e6:.2f} s of import in all "
          "(under -X importtime, which adds its own cost)")
    print("\ntop-level imports by cumulative time:")
    for depth, _, cumulative, name in sorted((r for r in rows if r[0] == 0), key=lambda r: -r[2])[:top]:
        print(f"  {cumulative / 1e6:6.3f} s  {name}")
    print("\nmodules by their own time (with their importers):")
    for _, own, _, name in sorted(rows, key=lambda r: -r[1])[:top]:
        chain, at = [], name
        while at in parent and len(chain) < 6:
            at = parent[at]
            chain.append(at)
        print(f"  {own / 1e6:6.3f} s  {name}  <- {' <- '.join(chain)}")
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-3000:])


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    {"timeline": timeline, "imports": imports}[mode](rest)
