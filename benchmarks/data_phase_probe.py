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
    parser.add_argument("--rows_per_convert_worker", type=int, nargs="+", default=[0],
                        help="also run with formats.ROWS_PER_CONVERT_WORKER set to each (1: a pool whenever "
                             "preprocessing_num_workers > 1, as before the change; 0: the code's value)")
    parser.add_argument("--out")
    args = parser.parse_args()
    from tunesmith.cli import _config_from
    from tunesmith.data import formats
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.load import load_preprocessing

    base = _config_from([args.yaml])
    tokenizer, _, media = load_preprocessing(base)
    default = formats.ROWS_PER_CONVERT_WORKER
    seconds: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for rows in args.rows_per_convert_worker:
            formats.ROWS_PER_CONVERT_WORKER = rows or default
            for workers in args.workers:
                cfg = _config_from([args.yaml, f"preprocessing_num_workers={workers}"])
                started = time.perf_counter()
                data = prepare_data(cfg, tokenizer, media)
                key = f"workers={workers},rows_per_convert_worker={rows or default}"
                seconds.setdefault(key, []).append(round(time.perf_counter() - started, 3))
                print(f"{key}: {seconds[key][-1]} s, {len(data.train)} rows", flush=True)
    result = {"cpus": os.cpu_count(), "seconds": seconds}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
