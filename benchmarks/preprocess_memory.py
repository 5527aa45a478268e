"""Peak memory of data preparation against the number of rows (issue 13: memory bounded by the cutoff, not the input).

    python benchmarks/preprocess_memory.py --rows 100000 1000000            # one subprocess per size
    python benchmarks/preprocess_memory.py --rows 100000 300000 --out r.json --workers 2

For each size the parent writes a synthetic alpaca-format JSON file (a JSON array, the format of LLaMA-Factory's
datasets; ~1,000 tiny:qwen3 tokens per record, cutoff_len 2048 so nothing is cut) and a dataset_info.json, then
starts a fresh subprocess that prepares it as `tunesmith data` / `tunesmith train` would: data.pipeline.prepare_data
(read, convert, render through the chat template, tokenize, write the verified cache entry). The child reports

- VmHWM: the kernel's peak resident set of the process (anonymous + file-backed pages mapped in it);
- the peaks of RssAnon (heap: Python objects, arrow buffers) and RssFile (pages of memory-mapped files, the
  libraries' included), sampled every 0.2 s from /proc/self/status;
- RSS before preparing (imports, tokenizer), ru_maxrss of the child and of its own children (data workers with
  --workers), the wall time, rows and tokens kept, the sizes of the JSON file and of the cache entry.

Everything is written under a temporary folder (TUNESMITH_CACHE and HF_DATASETS_CACHE point there) that is removed
afterwards (--keep keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CUTOFF_LEN = 2048  # above the record length: nothing is truncated, every token is kept


def _words() -> list[str]:
    from tunesmith.models.tiny.common import CORPUS

    return sorted(set(re.findall(r"[A-Za-z]+", CORPUS)))


def write_alpaca(path: Path, num_rows: int, words_per_row: int, seed: int = 0) -> int:
    """A JSON array of alpaca records, streamed to disk (the parent never holds the rows). Returns its size."""
    rng = random.Random(seed)
    words = _words()
    prompt_words = max(1, words_per_row // 10)
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n")
        for i in range(num_rows):
            record = {
                "instruction": f"Task {i}: " + " ".join(rng.choices(words, k=prompt_words)),
                "input": "",
                "output": " ".join(rng.choices(words, k=words_per_row - prompt_words)),
            }
            f.write(("," if i else "") + json.dumps(record) + "\n")
        f.write("]\n")
    return path.stat().st_size


class _Sampler(threading.Thread):
    """Peaks of RssAnon / RssFile (kB) from /proc/self/status; VmHWM is the kernel's own peak of their sum."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peaks = {"RssAnon": 0, "RssFile": 0}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.2):
            self.sample()

    def sample(self):
        for key, value in _status().items():
            if key in self.peaks:
                self.peaks[key] = max(self.peaks[key], value)


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                out[key] = int(rest.split()[0])
    return out


def child(num_rows: int, work: Path, workers: int | None) -> dict:
    """Runs in the subprocess: prepare the data and measure."""
    import resource

    sampler = _Sampler()
    sampler.start()
    from transformers import AutoTokenizer

    from tunesmith.config.load import build_config
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.tiny import build_tiny

    tokenizer = AutoTokenizer.from_pretrained(build_tiny("qwen3", work / "cache"))
    cfg = build_config(None, {
        "model_name_or_path": "tiny:qwen3", "dataset": "synthetic", "dataset_dir": str(work / "data"),
        "template": "chatml", "cutoff_len": CUTOFF_LEN, "output_dir": str(work / "out"),
        "preprocessing_num_workers": workers,
    })
    before = _status()
    start = time.perf_counter()
    data = prepare_data(cfg, tokenizer)
    seconds = time.perf_counter() - start
    sampler.stop.set()
    sampler.join()
    sampler.sample()
    after = _status()
    report = data.report
    cache_bytes = sum(p.stat().st_size for p in (work / "cache" / "tokenized").rglob("*") if p.is_file())
    return {
        "rows": num_rows, "num_rows_kept": report["num_rows"], "num_tokens": report["num_tokens"],
        "seconds": round(seconds, 1), "rows_per_s": round(num_rows / seconds),
        "VmHWM_MiB": round(after["VmHWM"] / 1024), "peak_RssAnon_MiB": round(sampler.peaks["RssAnon"] / 1024),
        "peak_RssFile_MiB": round(sampler.peaks["RssFile"] / 1024), "RSS_before_MiB": round(before["VmRSS"] / 1024),
        "ru_maxrss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "ru_maxrss_children_MiB": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "cache_MiB": round(cache_bytes / 2**20),
    }


def run_size(num_rows: int, words_per_row: int, workers: int | None, keep: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"tunesmith-mem-{num_rows}-"))
    try:
        (work / "data").mkdir()
        size = write_alpaca(work / "data" / "synthetic.json", num_rows, words_per_row)
        (work / "data" / "dataset_info.json").write_text(json.dumps({"synthetic": {"file_name": "synthetic.json"}}))
        env = {**os.environ, "TUNESMITH_CACHE": str(work / "cache"), "HF_DATASETS_CACHE": str(work / "hf"),
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, __file__, "--child", str(num_rows), "--work", str(work)]
        if workers:
            cmd += ["--workers", str(workers)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"child for {num_rows} rows failed:\n{proc.stderr[-4000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["json_MiB"] = round(size / 2**20)
        return result
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def versions() -> dict:
    import datasets
    import pyarrow
    import tokenizers
    import transformers

    return {"python": platform.python_version(), "datasets": datasets.__version__, "pyarrow": pyarrow.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                       f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--words", type=int, default=900, help="words per record (~1,000 tiny:qwen3 tokens)")
    parser.add_argument("--workers", type=int, default=None, help="preprocessing_num_workers")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here too")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.work, args.workers)))
        return 0
    results = {"versions": versions(), "workers": args.workers, "cutoff_len": CUTOFF_LEN, "sizes": []}
    for num_rows in args.rows:
        result = run_size(num_rows, args.words, args.workers, args.keep)
        results["sizes"].append(result)
        print(json.dumps(result), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    first, last = results["sizes"][0], results["sizes"][-1]
    if len(results["sizes"]) > 1:
        print(f"VmHWM {last['rows']} rows / {first['rows']} rows: {last['VmHWM_MiB'] / first['VmHWM_MiB']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
