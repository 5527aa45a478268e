"""Train as `tunesmith train KEY=VALUE ...` does (set_up + Runner.run, final model saved), then check the saved
Hugging Face folder against the engine's model: on the next micro-batch of the run's own data, the engine's
forward in fp32 (the trained fp32 master weights, no autocast) and plain transformers' forward of the saved folder
(loaded in fp32 with SDPA attention) must give the same logits at every real token. Run under torchrun:

    python -m torch.distributed.run --nproc_per_node 2 tests/gpu/train_and_check_export.py REPORT.json KEY=VALUE ...

Rank 0 compares its own micro-batch (with tensor or pipeline parallelism every rank holds the gathered logits) and
writes REPORT.json: the largest absolute logit difference, the largest logit, the positions compared and the
saved weights' dtype. Used by test_megatron_multi_gpu.py (issue 19 item 3).
"""

import json
import sys
from pathlib import Path

import torch


def engine_logits(runner, batch) -> torch.Tensor:
    from tunesmith.models.forward import LossFn

    engine = runner.engine
    kept, engine.precision = engine.precision, "fp32"  # the master weights as they are: no bf16 rounding
    try:
        return engine.forward([batch], LossFn("logits", lambda outputs, _: outputs.logits_BTV.float()))[0]
    finally:
        engine.precision = kept


def saved_logits(folder: Path, batch) -> tuple[torch.Tensor, str]:
    from transformers import AutoConfig

    from tunesmith.models.forward import run_forward
    from tunesmith.models.load import auto_model_class

    config = AutoConfig.from_pretrained(folder)
    model = auto_model_class(config).from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    stored = ",".join(sorted(_stored_dtypes(folder)))
    model.to(batch.input_ids_BT.device).eval()
    with torch.no_grad():
        return run_forward(model, batch, "logits").logits_BTV.float(), stored


def _stored_dtypes(folder: Path) -> set[str]:
    """The dtypes of every tensor in the folder's safetensors files (read from their headers)."""
    from safetensors import safe_open

    found = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            found |= {f.get_slice(name).get_dtype() for name in f.keys()}
    return found


def main(report: Path, items: list[str]) -> None:
    from tunesmith import dist
    from tunesmith.cli import _config_from
    from tunesmith.train.setup import set_up

    runner = set_up(_config_from([*items, "save_final_model=true"]))
    result = runner.run()
    batch = runner.source.next_step(runner.engine).updates[0][0].to(runner.engine.device)
    ours = engine_logits(runner, batch)
    dist.barrier()
    if dist.is_main():
        theirs, stored = saved_logits(Path(result.output_dir), batch)
        real = (batch.segment_ids_BT >= 0).cpu()
        theirs, ours = theirs.cpu(), ours.cpu()
        vocab = theirs.shape[-1]  # the engine's vocabulary may be padded for tensor parallelism
        diff = (ours[..., :vocab][real] - theirs[real]).abs()
        report.write_text(json.dumps({"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
                                      "max_abs_logit": theirs[real].abs().max().item(),
                                      "positions": int(real.sum()), "stored_dtype": stored,
                                      "engine_vocab": ours.shape[-1], "vocab": vocab}))
    dist.barrier()
    dist.shutdown(True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
