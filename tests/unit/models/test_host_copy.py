"""models/host_copy.py: GPU tensors reach the CPU unchanged, ties kept (runs where CUDA is; the CPU path is a no-op)."""

import pytest
import torch

from tunesmith.models import host_copy
from tunesmith.models.host_copy import host_state_dict


def test_cpu_state_is_returned_as_is():
    state = {"a": torch.ones(2)}
    assert host_state_dict(state) is state


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_copies_through_a_small_staging_buffer_and_keeps_ties(monkeypatch):
    monkeypatch.setattr(host_copy, "STAGING_BYTES", 1000)  # several passes per tensor
    w = torch.randn(37, 29, device="cuda")
    state = {"embed": w, "head": w, "half": torch.randn(501, device="cuda", dtype=torch.bfloat16),
             "step": 3}
    out = host_state_dict(state)
    assert out["embed"] is out["head"] and out["embed"].device.type == "cpu"
    torch.testing.assert_close(out["embed"], w.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(out["half"], state["half"].cpu(), rtol=0, atol=0)
    assert out["step"] == 3
