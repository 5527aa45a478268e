"""Where the model phase's seconds go on the GPU machine: the imports, then from_pretrained of a bf16 checkpoint in
fp32 (transformers converts on the CPU) or in bf16 followed by .float() on the GPU. One process per variant:

    python benchmarks/load_probe.py load_fp32 MODEL_DIR
    python benchmarks/load_probe.py load_bf16_then_float MODEL_DIR

Prints one JSON line per step: {"<variant>": step, "s": seconds}.
"""

import json
import sys
import time


def main() -> None:
    variant, model_dir = sys.argv[1], sys.argv[2]
    last = time.perf_counter()

    def mark(step: str) -> None:
        nonlocal last
        print(json.dumps({variant: step, "s": round(time.perf_counter() - last, 3)}), flush=True)
        last = time.perf_counter()

    import torch

    import tunesmith.train.setup  # noqa: F401 - timed: what a training run imports first
    mark("import setup")
    import transformers.modeling_utils  # noqa: F401
    mark("import modeling_utils")
    import liger_kernel.transformers.monkey_patch  # noqa: F401
    mark("import liger monkey_patch")
    from transformers import AutoModelForCausalLM

    torch.zeros(1, device="cuda")
    mark("cuda init")
    dtype = torch.float32 if variant == "load_fp32" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map="cuda")
    torch.cuda.synchronize()
    mark("from_pretrained")
    if variant != "load_fp32":
        model.float()
        torch.cuda.synchronize()
        mark("float()")


if __name__ == "__main__":
    main()
