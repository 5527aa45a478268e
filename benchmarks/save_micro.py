"""Where the final save's seconds go: a model on the GPU (fp32 masters) written with save_pretrained as is, with its
state dict copied to the CPU first, and with tunesmith's writer (models/safetensors_write.py) at several shard
sizes (the shards written side by side); the writer's files are read back and compared with the model.

    python benchmarks/save_micro.py MODEL_DIR [--out save.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import torch
from kernel_micro import report  # benchmarks/ is the script's folder
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tunesmith.models import safetensors_write
from tunesmith.models.safetensors_write import save_weights


def _timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round(time.perf_counter() - start, 2)


def _same_as_model(model, folder: Path) -> bool:
    saved = {}
    for file in folder.glob("*.safetensors"):
        saved.update(load_file(file))
    state = model.state_dict()
    return all(torch.equal(tensor, state[name].cpu()) for name, tensor in saved.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, device_map="cuda")
    result = {}
    runs = [("as_is", None), ("cpu_first", None), ("writer_one_file", "50GB"), ("writer_4GB", "4GB"),
            ("writer_2GB", "2GB"), ("writer_1GB", "1GB"), ("writer_2GB_again", "2GB"), ("as_is_again", None)]
    for name, shard_size in runs:
        folder = Path(f"/tmp/save-{name}")
        shutil.rmtree(folder, ignore_errors=True)
        os.sync()  # no dirty pages of an earlier variant left to slow this one's writes
        if name.startswith("as_is"):
            result[name] = {"total_s": _timed(lambda: model.save_pretrained(folder))}
        elif name == "cpu_first":
            state = {}
            copy_s = _timed(lambda: state.update({k: v.detach().to("cpu") for k, v in model.state_dict().items()}))
            write_s = _timed(lambda: model.save_pretrained(folder, state_dict=state))
            result[name] = {"copy_s": copy_s, "write_s": write_s, "total_s": round(copy_s + write_s, 2)}
        else:
            safetensors_write.SHARD_SIZE = shard_size
            result[name] = {"total_s": _timed(lambda: save_weights(model, folder)),
                            "files": len(list(folder.glob("*.safetensors"))),
                            "same_weights": _same_as_model(model, folder)}
    result["bytes"] = sum(f.stat().st_size for f in Path("/tmp/save-as_is").iterdir())
    report(result, args.out)


if __name__ == "__main__":
    main()
