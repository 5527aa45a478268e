"""A quiet console: tunesmith's own progress and log lines, not the libraries' warnings and bars.

Set once per command, before the libraries are imported (DeepSpeed announces its accelerator at import).
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager

_LIBRARIES = ("datasets", "transformers", "peft", "accelerate", "torch", "deepspeed", "httpx", "urllib3",
              "liger_kernel", "bitsandbytes")


def quiet_libraries() -> None:
    # DeepSpeed probes for an accelerator at import and warns when it finds none; on a machine without CUDA
    # the CPU accelerator is the right answer, so name it (a user's own DS_ACCELERATOR wins).
    if "DS_ACCELERATOR" not in os.environ and not _has_cuda():
        os.environ["DS_ACCELERATOR"] = "cpu"
    # Imported first: transformers sets its loggers' level when its logging module first loads.
    from datasets.utils import logging as datasets_logging
    from transformers.utils import logging as hf_logging

    for name in _LIBRARIES:
        logging.getLogger(name).setLevel(logging.ERROR)
    # Deprecation notices are for the libraries' developers, not for someone training a model.
    for category in (FutureWarning, DeprecationWarning):
        for module in _LIBRARIES:
            warnings.filterwarnings("ignore", category=category, module=rf"{module}(\.|$)")
    datasets_logging.disable_progress_bar()  # tunesmith shows its own status while it prepares data
    hf_logging.disable_progress_bar()  # weight-loading bars; our own bar shows training


@contextmanager
def held_back(name: str = "tunesmith"):
    """The logger's lines (below ERROR) dropped inside the block: for a dry run of a step the real run then takes and
    reports itself (the memory estimate's pass over the fine-tuning settings)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


_said: set[str] = set()  # messages already said: a run reads its config and decides its kernels several times


def say_once(message: str, level: int = logging.INFO) -> None:
    """Log `message` to tunesmith's log the first time this process says it."""
    if message not in _said:
        _said.add(message)
        logging.getLogger("tunesmith").log(level, message)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
