"""tunesmith: fine-tune and post-train language and vision-language models."""

import os

# PyTorch's OpenMP threads spin while waiting by default; when two CPU jobs share a
# small machine (a test runner and a training subprocess, say) the spinning threads
# starve each other and CPU training slows down 20-50x. Passive waiting costs little.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
