"""`tunesmith train ... backend=megatron` on the CPU: the same per-step losses as the single engine from the same
initialisation and data (packing and gradient accumulation on), and a final model plain transformers loads with
the single engine's weights. Skipped without megatron-core."""

import pytest
import torch

pytest.importorskip("megatron.core")

from safetensors.torch import load_file  # noqa: E402

from test_cli import BASE, cli, metrics  # noqa: E402

COMMON = [*BASE, "dataset=alpaca_demo", "finetuning_type=full", "max_samples=48", "logging_steps=1",
          "learning_rate=1e-3", "max_steps=4", "per_device_train_batch_size=2", "gradient_accumulation_steps=2",
          "neat_packing=true", "save_strategy=no"]


def test_megatron_engine_trains_sft_with_the_single_engines_losses(tmp_path):
    single, mega = tmp_path / "single", tmp_path / "megatron"
    cli("train", *COMMON, "backend=single", f"output_dir={single}")
    proc = cli("train", *COMMON, f"output_dir={mega}", env={"USE_MCA": "1"})
    assert proc.stderr.count("local (torch-native) layer spec") + proc.stdout.count("local (torch-native) layer spec") == 1
    ours = [m["loss"] for m in metrics(mega) if "loss" in m]
    theirs = [m["loss"] for m in metrics(single) if "loss" in m]
    assert len(ours) == 4 and ours == pytest.approx(theirs, rel=1e-4)
    a, b = load_file(mega / "model.safetensors"), load_file(single / "model.safetensors")
    assert set(a) == set(b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-5)
    import transformers

    transformers.AutoModelForCausalLM.from_pretrained(mega)
