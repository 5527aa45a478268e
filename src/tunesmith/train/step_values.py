"""A step's scalars (loss, method sums, gradient norm, skipped) read on the host without draining the GPU.

Reading a CUDA tensor on the host (`float(t)`) waits for everything queued before it, the next step's work
included once the host has queued that. So as soon as a step is queued, its scalars go into one non-blocking
copy to pinned memory behind an event; reading them waits for that event only. The Runner queues step k+1
before it reads step k, and the GPU never runs out of work while the host logs.
"""

from __future__ import annotations

import torch

from ..engines.base import StepOutput, StepResult


def _flat(outs: list[StepOutput], results: list[StepResult]) -> list:
    values = []
    for out in outs:
        values.append(out.loss)
        values.extend(out.sums.values())
    for result in results:
        values += [result.grad_norm, result.skipped]
    return values


class StepValues:
    """The forward_backward outputs and step results of one step, their device scalars on their way to the host."""

    def __init__(self, outs: list[StepOutput], results: list[StepResult]):
        self.outs, self.results = outs, results
        flat = _flat(outs, results)
        self._on_gpu = [i for i, value in enumerate(flat) if torch.is_tensor(value) and value.is_cuda]
        self._copy = self._done = None
        if self._on_gpu:
            stacked = torch.stack([flat[i].detach().reshape(()).to(torch.float32) for i in self._on_gpu])
            self._copy = stacked.to("cpu", non_blocking=True)  # pinned, so the copy is asynchronous
            self._done = torch.cuda.Event()
            self._done.record(torch.cuda.current_stream(stacked.device))

    def read(self) -> tuple[list[StepOutput], list[StepResult]]:
        """The outputs and results with host values (float, bool); waits for this step's copy only."""
        flat = _flat(self.outs, self.results)
        if self._done is not None:
            self._done.synchronize()
            for i, value in zip(self._on_gpu, self._copy.tolist()):
                flat[i] = value
        values = iter(float(v) for v in flat)
        outs = [StepOutput(next(values), {key: next(values) for key in out.sums}, out.count) for out in self.outs]
        results = [StepResult(next(values), bool(next(values)), r.lr, r.may_skip, r.on_skip) for r in self.results]
        return outs, results
