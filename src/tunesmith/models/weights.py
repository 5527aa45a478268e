"""Loading a checkpoint's weights (safetensors only) into a model built by tunesmith."""

from __future__ import annotations

from pathlib import Path

from ..errors import TunesmithError


def load_model_weights(model, ckpt: Path) -> None:
    """Load checkpoint weights into the (possibly PEFT-wrapped) model in place."""
    from safetensors.torch import load_file

    adapter = ckpt / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(adapter)))
        return
    state = {}
    for file in sorted(ckpt.glob("*.safetensors")):
        state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise TunesmithError(f"checkpoint {ckpt} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
