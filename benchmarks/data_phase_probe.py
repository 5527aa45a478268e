"""Issue 15's data phase (read, render, tokenize, cache: ~1.0-1.3 s of the LLaMA-Factory YAML's run on the device
machine) at several preprocessing_num_workers, in one process, each run re-tokenizing (overwrite_cache: true).

    python benchmarks/data_phase_probe.py /tmp/lfw/lf.yaml --workers 1 2 4 8 16 --repeat 2 --out probe.json

Prints and writes the seconds of prepare_data per worker count (each count run --repeat times, in turn).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("yaml")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    from tunesmith.cli import _config_from
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.load import load_preprocessing

    base = _config_from([args.yaml])
    tokenizer, _, media = load_preprocessing(base)
    seconds: dict[int, list[float]] = {n: [] for n in args.workers}
    for _ in range(args.repeat):
        for workers in args.workers:
            cfg = _config_from([args.yaml, f"preprocessing_num_workers={workers}"])
            started = time.perf_counter()
            data = prepare_data(cfg, tokenizer, media)
            seconds[workers].append(round(time.perf_counter() - started, 3))
            print(f"workers {workers}: {seconds[workers][-1]} s, {len(data.train)} rows", flush=True)
    result = {"cpus": os.cpu_count(), "seconds": seconds}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
