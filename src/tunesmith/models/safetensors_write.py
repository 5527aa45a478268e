"""Writing weights as safetensors files fast, from the GPU or the CPU.

safetensors first copies each GPU tensor to ordinary, pageable CPU memory (~1.3 GB/s on the H200 machine), then
writes the file. Here each tensor's bytes go to the file with os.pwrite straight from where they lie: a GPU tensor
through two pinned buffers, one filled by the copy engine while the other is written. The file has safetensors'
layout (the header's length as 8 little-endian bytes, the JSON header padded to 8 bytes, then the data, largest
element size first) and is read by safetensors itself.

`save_weights` has transformers' save_pretrained write this way, the shards of a large model side by side, one
thread each: writes to one file take turns (the file system locks it), writes to several do not.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import torch

WRITERS = 8  # shard files written at once
PART_BYTES = 32 * 1024**2  # one copy-and-write
SHARD_SIZE = "2GB"

_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def write_safetensors(tensors: dict[str, torch.Tensor], filename, metadata: dict[str, str] | None = None) -> None:
    """`tensors` (contiguous or not, on any device) into the safetensors file `filename`."""
    if any(t.dtype not in _DTYPES for t in tensors.values()):
        from safetensors.torch import save_file

        save_file({k: t.contiguous() for k, t in tensors.items()}, filename, metadata=metadata)
        return
    names = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))
    header, parts, offset = {}, [], 0
    for name in names:
        data = tensors[name].detach().contiguous().reshape(-1).view(torch.uint8)
        header[name] = {"dtype": _DTYPES[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + data.numel()]}
        parts += [(data[begin:begin + PART_BYTES], offset + begin) for begin in range(0, data.numel(), PART_BYTES)]
        offset += data.numel()
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    fd = os.open(filename, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, struct.pack("<Q", len(blob)) + blob, 0)
        _write_parts(fd, parts, 8 + len(blob))
    except BaseException:
        os.unlink(filename)  # no half-written file left behind
        raise
    finally:
        os.close(fd)


def _write_parts(fd: int, parts: list, start: int) -> None:
    """Each (bytes, offset) part at start + offset; a CUDA part is copied to pinned memory while the one before it
    is written."""
    buffers, pending = [], None  # pending: (host bytes, file offset, copy done event)
    for data, offset in parts:
        if data.device.type != "cuda":  # the CPU's bytes as they lie; another device's (MPS) copied over plainly
            ready = (data.cpu(), start + offset, None)
        else:
            if not buffers:
                buffers = [torch.empty(PART_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            host = buffers[0][:data.numel()]
            buffers.reverse()
            with torch.cuda.device(data.device):
                host.copy_(data, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
            ready = (host, start + offset, done)
        if pending is not None:
            _write_pending(fd, *pending)
        pending = ready
    if pending is not None:
        _write_pending(fd, *pending)


def _write_pending(fd: int, host: torch.Tensor, at: int, done) -> None:
    if done is not None:
        done.synchronize()
    _write_all(fd, memoryview(host.numpy()), at)


def _write_all(fd: int, data, at: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        written = os.pwrite(fd, view, at)
        view, at = view[written:], at + written


@contextlib.contextmanager
def fast_weight_writes():
    """While open, transformers' save_pretrained hands each shard file to write_safetensors on a thread of its own;
    on leaving, every file is written (or the first error raised)."""
    import transformers.modeling_utils as modeling_utils

    original = modeling_utils.safe_save_file
    with ThreadPoolExecutor(WRITERS) as pool:
        writes = []

        def submit(tensors, filename, metadata=None):
            writes.append(pool.submit(write_safetensors, tensors, filename, metadata))

        modeling_utils.safe_save_file = submit
        try:
            yield
        finally:
            modeling_utils.safe_save_file = original
            for write in writes:
                write.result()


def save_weights(model, path, state_dict: dict | None = None) -> None:
    """model.save_pretrained(path) in safetensors (`state_dict` instead of the model's own when given), in shards of
    up to SHARD_SIZE written side by side. A PEFT model's adapters are small: PEFT writes them itself."""
    if hasattr(model, "peft_config"):
        model.save_pretrained(str(path), state_dict=state_dict, safe_serialization=True)
        return
    with fast_weight_writes():
        model.save_pretrained(str(path), state_dict=state_dict, safe_serialization=True, max_shard_size=SHARD_SIZE)
