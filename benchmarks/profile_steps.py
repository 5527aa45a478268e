"""Where does a training step's time go? Data wait, forward+backward, optimiser step, plus a torch.profiler table.

    python benchmarks/profile_steps.py cfg.yaml [key=value ...]     (same keys as `tunesmith train`)
"""

from __future__ import annotations

import sys
import time

import torch

from tunesmith.config.load import build_config, parse_cli_items
from tunesmith.data.pipeline import prepare_data
from tunesmith.methods import build_method
from tunesmith.models.adapters import apply_finetuning
from tunesmith.models.kernels import fused_ce_for
from tunesmith.models.load import load_model, load_preprocessing, pick_device
from tunesmith.train.loop import _build_engine
from tunesmith.train.plan import EpochPlan, micro_batch_loader


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    yaml_path, overrides = parse_cli_items(sys.argv[1:])
    cfg = build_config(yaml_path, overrides)
    device = pick_device()
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media)
    model = apply_finetuning(load_model(cfg.model, device), cfg.finetune)
    plan = EpochPlan.from_config(cfg, data.train["length"], num_epochs=1, max_steps=-1, seed=0)
    engine = _build_engine(cfg, model, device, plan.total_steps)
    method = build_method(cfg, model, fused_ce_for(model, cfg.model))
    def batches():
        for epoch in range(1000):
            yield from micro_batch_loader(data.train, plan, epoch, 0, tokenizer.pad_token_id,
                                          cfg.data.dataloader_num_workers, media, method.collate)

    loader = batches()
    waits, computes, steps, tokens = 0.0, 0.0, 0.0, 0
    for i in range(48):
        t0 = time.perf_counter()
        batch = next(loader)
        t1 = time.perf_counter()
        if i == 40:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        engine.forward_backward(batch, lambda m, b: method.loss(m, b, max(method.units(b), 1)))
        _sync()
        t2 = time.perf_counter()
        if (i + 1) % cfg.train.gradient_accumulation_steps == 0:
            engine.step()
            _sync()
        t3 = time.perf_counter()
        if i >= 8:  # skip warm-up
            waits, computes, steps, tokens = waits + t1 - t0, computes + t2 - t1, steps + t3 - t2, tokens + batch.num_tokens
    prof.__exit__(None, None, None)
    n = 40
    print(f"per micro-batch over {n}: data wait {1e3 * waits / n:.1f} ms, forward+backward {1e3 * computes / n:.1f} ms, "
          f"optimiser {1e3 * steps / n:.1f} ms; {tokens / n:.0f} tokens; {tokens / (waits + computes + steps):.0f} tokens/s")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
