"""PiSSA (LLaMA-Factory's pissa_init): LoRA adapters initialised from the principal singular vectors of each
adapted weight, PEFT's init_lora_weights "pissa" / "pissa_niter_<n>".

PEFT moves the top lora_rank singular components of each weight W into the adapter (B A) and leaves the residual
W - B A in the base layer, so the model starts unchanged and the adapter trains the principal part. The base under
the adapter is then the residual, not the pretrained weight: a PiSSA adapter folder is only right on a base that
PEFT re-initialised the same way, which it does when it loads one (the residual is recomputed from the pretrained
weight). The fast SVD ("pissa_niter_<n>", LLaMA-Factory's default of 16 iterations) draws random numbers, so both
the training run and every load draw them from one CPU generator seeded with PISSA_SEED (`seeded`): the residual
is the same in training, on resume and in chat / serve / export. pissa_convert also writes LLaMA-Factory's pissa_converted/: an ordinary LoRA of twice the
rank on the pretrained model (PEFT's conversion against the initial adapter in pissa_init/), which loads anywhere
(plain PEFT, vLLM) without PiSSA's initialisation."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

import torch

from ..config.recorded import adapter_config, checkpoint_config, saved_config
from ..quiet import say_once

log = logging.getLogger("tunesmith")

PISSA_SEED = 0
INITIAL_DIR, CONVERTED_DIR = "pissa_init", "pissa_converted"


def init_lora_weights(iterations: int) -> str:
    """PEFT's name for PiSSA with `iterations` of the fast SVD (-1: the exact SVD)."""
    return "pissa" if iterations == -1 else f"pissa_niter_{iterations}"


def _init_of(adapter_dir: str | Path):
    """The adapter's init_lora_weights (None for a folder without adapter_config.json)."""
    if not (Path(adapter_dir) / "adapter_config.json").is_file():
        return None
    return adapter_config(adapter_dir).get("init_lora_weights")


def is_pissa(adapter_dir: str | Path) -> bool:
    return _names_pissa(_init_of(adapter_dir))


def _names_pissa(init) -> bool:
    return isinstance(init, str) and init.startswith("pissa")


@contextlib.contextmanager
def seeded(applies: bool = True):
    """PiSSA's random draws (the fast SVD's torch.randn) from one CPU generator seeded with PISSA_SEED, moved to the
    weight's device: the same numbers whether the weights are on a GPU (training) or the CPU (chat, export), and
    the run's own random state untouched. The rest of PEFT's initialisation draws as usual."""
    if not applies:
        yield
        return
    generator, real = torch.Generator().manual_seed(PISSA_SEED), torch.randn

    def randn(*size, device=None, **kwargs):
        kwargs.setdefault("generator", generator)
        return real(*size, **kwargs).to(device) if device is not None else real(*size, **kwargs)

    torch.randn = randn
    try:
        yield
    finally:
        torch.randn = real


def load_adapter_model(model, adapter_dir: str | Path, **kwargs):
    """PeftModel.from_pretrained, a PiSSA adapter's residual base recomputed as its training run computed it."""
    from peft import PeftModel

    init = _init_of(adapter_dir)
    pissa = _names_pissa(init)
    # the exact SVD ("pissa") draws nothing: any tool's residual is the same
    if pissa and init != "pissa" and not (saved_config(adapter_dir) or checkpoint_config(adapter_dir)):
        say_once(f"{adapter_dir} is a PiSSA adapter another tool trained: its base's residual is recomputed with "
                 "tunesmith's draws, which differ from that run's (slightly, with the fast SVD); its converted "
                 "adapter (LLaMA-Factory's pissa_converted) loads exactly", logging.WARNING)
    with seeded(pissa):
        return PeftModel.from_pretrained(model, str(adapter_dir), **kwargs)


@contextlib.contextmanager
def _swapped(config):
    kept, config.init_lora_weights = config.init_lora_weights, True
    try:
        yield
    finally:
        config.init_lora_weights = kept


def save_initial(model, output_dir: Path) -> Path:
    """The adapter as initialised (before any step), which conversion subtracts: output_dir/pissa_init."""
    folder = output_dir / INITIAL_DIR
    with _swapped(model.peft_config["default"]):
        model.save_pretrained(str(folder))
    return folder


def converts(finetune) -> bool:
    """Whether the run writes pissa_init/ and pissa_converted/ (pissa_convert, with pissa_init)."""
    return finetune.pissa_init and finetune.pissa_convert


def save_converted(model, output_dir: Path, saver) -> Path:
    """output_dir/pissa_converted: the trained adapter as an ordinary LoRA of the pretrained weights, with the
    tokenizer (`saver`'s: the chat template) and the run's record, as the adapter beside it has them."""
    folder = output_dir / CONVERTED_DIR
    model.save_pretrained(str(folder), path_initial_model_for_weight_conversion=str(output_dir / INITIAL_DIR))
    saver.save_pretrained(str(folder))
    shutil.copy(output_dir / "tunesmith_config.yaml", folder)
    log.info("PiSSA adapter converted to an ordinary LoRA (rank x 2): %s", folder)
    return folder
