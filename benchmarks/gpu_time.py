"""GPU milliseconds per call of a piece of work, by CUDA events, for the kernel probes."""

import torch


def gpu_ms(work, iters: int = 50) -> float:
    """Mean GPU time of `work()` over `iters` calls after 5 warm-up calls; the host queues every call behind a
    short GPU sleep, so launch overhead does not count where the GPU is the bound."""
    for _ in range(5):
        work()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(5e8))
    start.record()
    for _ in range(iters):
        work()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / iters, 4)
