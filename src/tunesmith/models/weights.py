"""Loading a checkpoint's weights (safetensors only) into a model built by tunesmith."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import torch

from ..errors import TunesmithError

_ADAPTER = "adapter_model.safetensors"
# one expert's projection as save_pretrained writes it: <layer>.mlp.experts.<i>.<gate_proj|up_proj|down_proj>.weight
_PER_EXPERT = re.compile(r"^(?P<experts>.*\.experts\.)(?P<index>\d+)\.(?P<part>gate_proj|up_proj|down_proj)\.weight$")


def read_safetensors(file: Path) -> dict:
    """A safetensors file's tensors, or an error naming the file (truncated, corrupt, not safetensors)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise TunesmithError(f"{file} is not a readable safetensors file ({type(err).__name__}: {err}): truncated "
                             "or corrupt. Resume from another checkpoint (resume_from_checkpoint: <path>)") from None


def checkpoint_tensors(ckpt: Path) -> tuple[dict, bool]:
    """(tensors, is_adapter): the PEFT adapter if the folder holds one, else every *.safetensors shard."""
    if (ckpt / _ADAPTER).exists():
        return read_safetensors(ckpt / _ADAPTER), True
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise TunesmithError(f"{ckpt} holds no model.safetensors or {_ADAPTER}: no weights to resume (weights in "
                             "another format, e.g. a sharded FSDP checkpoint, are not read)")
    state = {}
    for file in files:
        state.update(read_safetensors(file))
    return state, False


def load_model_weights(model, ckpt: Path) -> None:
    """Load checkpoint weights into the (possibly PEFT-wrapped) model in place."""
    state, is_adapter = checkpoint_tensors(ckpt)
    if is_adapter:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, state)
        return
    state = with_fused_experts(state, model.state_dict().keys())
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise TunesmithError(f"checkpoint {ckpt} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def weights_by_model_key(model, model_keys, ckpt: Path) -> dict:
    """The checkpoint's tensors keyed as the model's state dict names them (a PEFT adapter file leaves the
    adapter name out of its keys; it is put back), for engines that load a full state dict themselves."""
    state, is_adapter = checkpoint_tensors(ckpt)
    keys = set(model_keys)
    state = with_fused_experts(state, keys)
    names = list(getattr(model, "peft_config", {}) or {}) if is_adapter else []
    by_saved = {}
    for key in keys:
        saved = key
        for name in names:
            saved = saved.replace(f".{name}", "")
        by_saved.setdefault(saved, key)
    out, unexpected = {}, []
    for saved, value in state.items():
        key = saved if saved in keys else by_saved.get(saved)
        if key is None:
            unexpected.append(saved)
        else:
            out[key] = value
    if unexpected or not out:
        raise TunesmithError(f"checkpoint {ckpt} does not match the model: unexpected {unexpected[:5]}")
    return out


def with_fused_experts(state: dict, model_keys) -> dict:
    """`state` with each MoE layer's per-expert projections fused as the model holds them. transformers 5 keeps a
    layer's experts as two tensors (experts.gate_up_proj [E, 2I, H]: each expert's gate rows then its up rows;
    experts.down_proj [E, H, I]), fuses the published per-expert weights when it loads a checkpoint, and splits them
    again in save_pretrained, so a checkpoint it saved (Qwen3-MoE, DeepSeek-V3, GLM-4.5) reads back only fused.
    Other tensors, and a layer whose experts are not all there, are left as they are."""
    keys = set(model_keys)
    layers: dict = defaultdict(lambda: defaultdict(dict))
    out = {}
    for name, tensor in state.items():
        match = _PER_EXPERT.match(name)
        if match and match["experts"] + "gate_up_proj" in keys and match["experts"] + "down_proj" in keys:
            layers[match["experts"]][match["part"]][int(match["index"])] = tensor
        else:
            out[name] = tensor
    for experts, parts in layers.items():
        count = len(parts["down_proj"])
        if any(sorted(parts[part]) != list(range(count)) for part in ("gate_proj", "up_proj", "down_proj")):
            out.update({f"{experts}{i}.{part}.weight": tensor
                        for part, by_index in parts.items() for i, tensor in by_index.items()})
            continue
        out[experts + "gate_up_proj"] = torch.stack([torch.cat([parts["gate_proj"][i], parts["up_proj"][i]])
                                                     for i in range(count)])
        out[experts + "down_proj"] = torch.stack([parts["down_proj"][i] for i in range(count)])
    return out
