"""Where the final save's seconds go: a model on the GPU (fp32 masters) written with save_pretrained as is, and with
its state dict copied to the CPU first in one pass.

    python benchmarks/save_micro.py MODEL_DIR [--out save.json]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch
from kernel_micro import report  # benchmarks/ is the script's folder
from transformers import AutoModelForCausalLM

from tunesmith.models.host_copy import host_state_dict


def _timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round(time.perf_counter() - start, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, device_map="cuda")
    result = {}
    for name in ("as_is", "cpu_first", "staged", "as_is_again"):
        folder = Path(f"/tmp/save-{name}")
        shutil.rmtree(folder, ignore_errors=True)
        if name.startswith("as_is"):
            result[name] = {"total_s": _timed(lambda: model.save_pretrained(folder))}
            continue
        state = {}
        copy = (host_state_dict if name == "staged" else lambda sd: {k: v.detach().to("cpu") for k, v in sd.items()})
        copy_s = _timed(lambda: state.update(copy(model.state_dict())))
        write_s = _timed(lambda: model.save_pretrained(folder, state_dict=state))
        result[name] = {"copy_s": copy_s, "write_s": write_s, "total_s": round(copy_s + write_s, 2)}
    result["bytes"] = sum(f.stat().st_size for f in Path("/tmp/save-as_is").iterdir())
    report(result, args.out)


if __name__ == "__main__":
    main()
