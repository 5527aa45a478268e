"""The tiled vision-language families end to end through the real CLI, on the shipped image demos:
InternVL 3 (tiny:internvl), Idefics3 / SmolVLM (tiny:idefics3), SmolVLM2 (tiny:smolvlm), Mistral 3 (tiny:mistral3), LLaVA-OneVision
(tiny:llava_onevision), Llama 4 (tiny:llama4, MoE), Phi-4-multimodal (tiny:phi4_multimodal, images here), Pixtral-12B (tiny:pixtral), Gemma 3n (tiny:gemma3n, images here), GLM-4.1V (tiny:glm4v, mRoPE), GLM-4.5V (tiny:glm4v_moe, its MoE language model), PaliGemma 2 (tiny:paligemma, a prefix LM), Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL MoE (tiny:qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe), and the Qwen2.5-Omni and Qwen3-Omni thinkers (tiny:qwen2_5_omni, tiny:qwen3_omni, MoE; images here).

Default run, per family: full SFT with the vision tower and projector trained too, and the saved folder loads in
plain transformers (AutoModelForImageTextToText + AutoProcessor), whose processor expands the image as the
training data did, and generates. Slow: LoRA SFT mixing image and text-only records, chat with the adapter about
an image, and a DPO step on the image preference pairs.
"""

import math

import pytest
import torch

from test_cli import DATA, cli, grpo_step_on_image_prompts, metrics

IMAGE = f"{DATA}/mllm_demo_data/image_000.png"
BASE = [f"dataset_dir={DATA}", "cutoff_len=1024", "logging_steps=1"]
MODEL_CLASS = {"internvl": "InternVLForConditionalGeneration", "idefics3": "Idefics3ForConditionalGeneration",
               "smolvlm": "SmolVLMForConditionalGeneration",
               "mistral3": "Mistral3ForConditionalGeneration", "glm4v": "Glm4vForConditionalGeneration",
               "glm4v_moe": "Glm4vMoeForConditionalGeneration",
               "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration", "paligemma": "PaliGemmaForConditionalGeneration",
               "llava_onevision": "LlavaOnevisionForConditionalGeneration",
               "qwen3_omni": "Qwen3OmniMoeThinkerForConditionalGeneration",
               "llama4": "Llama4ForConditionalGeneration", "phi4_multimodal": "Phi4MultimodalForCausalLM",
               "pixtral": "LlavaForConditionalGeneration", "gemma3n": "Gemma3nForConditionalGeneration",
               "qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
               "qwen3_vl": "Qwen3VLForConditionalGeneration",
               "qwen2_5_omni": "Qwen2_5OmniThinkerForConditionalGeneration"}
# the 128x96 demo image: 4 tiles of 4 tokens and the thumbnail; 2x2 tiles and the global image, 4 tokens each;
# 2x2 merged patches; a 3x5 grid of merged patches; the whole image and 2x2 tiles with their newlines
NUM_IMAGE_TOKENS = {"internvl": 20, "idefics3": 20, "smolvlm": 20, "mistral3": 4, "glm4v": 15, "glm4v_moe": 15, "paligemma": 4, "qwen3_vl_moe": 12, "llava_onevision": 24,
                    "qwen3_omni": 12,  # 4x3 merged 16-pixel patches
                    "llama4": 20,  # 2x2 tiles and the whole image, 4 <|patch|> tokens each
                    "phi4_multimodal": 477, "pixtral": 12, "gemma3n": 16,
                    "qwen2_vl": 15, "qwen2_5_vl": 15, "qwen3_vl": 12, "qwen2_5_omni": 15}  # the global crop (16x16 and separators) and the used part of one sub-crop
ARCHS = sorted(MODEL_CLASS)
# LLaMA-Factory's template names for these families (LLaMA-Factory has none for Idefics3 / SmolVLM, OneVision)
TEMPLATE = {"internvl": "intern_vl", "idefics3": "auto", "smolvlm": "auto", "mistral3": "mistral_small", "glm4v": "glm4v", "glm4v_moe": "glm4_5v", "paligemma": "paligemma", "qwen3_vl_moe": "qwen3_vl",
            "llava_onevision": "auto", "qwen3_omni": "qwen3_omni", "llama4": "llama4", "phi4_multimodal": "phi4_mini",
            "pixtral": "pixtral", "gemma3n": "gemma3n", "qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl",
            "qwen3_vl": "qwen3_vl", "qwen2_5_omni": "qwen2_omni"}
PROMPT = "Describe the image."


def _losses(out):
    return [m["loss"] for m in metrics(out) if "loss" in m]


def _plain_transformers_run(out, arch):
    from PIL import Image
    from transformers import AutoModelForMultimodalLM, AutoProcessor

    from tunesmith.models.families import FAMILIES

    model = AutoModelForMultimodalLM.from_pretrained(out).eval()
    processor = AutoProcessor.from_pretrained(out)
    assert type(model).__name__ == MODEL_CLASS[arch] and model.config.model_type in FAMILIES[arch].model_types
    # transformers 5.25 loads Phi-4-multimodal's processor without its saved template: the tokenizer has it
    templated = processor if processor.chat_template else processor.tokenizer
    text = templated.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}],
        tokenize=False, add_generation_prompt=True)
    if arch == "paligemma":  # its processor writes <bos> and the newline itself: given its own prompt format
        text = "<image>" + PROMPT
    inputs = processor(text=[text], images=[Image.open(IMAGE).convert("RGB")], add_special_tokens=False,
                       return_tensors="pt")
    image_token_id = getattr(model.config, "image_token_id", None) or model.config.vision_config.image_token_id
    assert int((inputs["input_ids"] == image_token_id).sum()) == NUM_IMAGE_TOKENS[arch]
    for key in [k for k in inputs if "pixel_values" in k]:  # Llama 4's processor gives bf16 pixels
        inputs[key] = inputs[key].to(model.dtype)
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert ids.shape[1] > inputs["input_ids"].shape[1]


@pytest.mark.parametrize("arch", ARCHS)
def test_vlm_family_full_sft_then_the_folder_runs_in_plain_transformers(tmp_path, arch):
    out = tmp_path / "full"
    proc = cli("train", f"model_name_or_path=tiny:{arch}", f"template={TEMPLATE[arch]}", *BASE, "dataset=mllm_demo",
               "max_samples=4", "per_device_train_batch_size=4", "finetuning_type=full", "freeze_vision_tower=false", "freeze_multi_modal_projector=false",
               "learning_rate=1e-3", "max_steps=3", f"output_dir={out}")
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "vision_tower 0/" not in said and "projector 0/" not in said  # both trained
    losses = _losses(out)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]  # the same 4 rows
    _plain_transformers_run(out, arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_vlm_family_lora_sft_with_text_records_chat_then_a_dpo_step(tmp_path, arch):
    lora, dpo = tmp_path / "lora", tmp_path / "dpo"
    tower = [] if arch == "gemma3n" else ["freeze_vision_tower=false"]  # Gemma 3n's tower: convolutions, no LoRA
    cli("train", f"model_name_or_path=tiny:{arch}", *BASE, "dataset=mllm_demo,identity", "max_samples=8",
        "finetuning_type=lora", *tower, "per_device_train_batch_size=2", "max_steps=2", f"output_dir={lora}")
    assert (lora / "adapter_config.json").is_file() and len(_losses(lora)) == 2
    answer = cli("chat", "--model", lora, "--image", IMAGE, "--prompt", PROMPT, "--max_new_tokens", "4")
    assert answer.returncode == 0 and "Traceback" not in answer.stderr
    cli("train", f"model_name_or_path=tiny:{arch}", *BASE, "stage=dpo", "dataset=mllm_dpo_demo", "max_samples=4",
        "finetuning_type=lora", "max_steps=1", f"output_dir={dpo}")
    [loss] = _losses(dpo)
    assert loss == pytest.approx(math.log(2), abs=1e-3)  # the first step: policy == reference


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["paligemma", "llama4", "phi4_multimodal", "idefics3", "gemma3n"])
def test_one_grpo_step_on_image_prompts(tmp_path, arch):
    """Rollouts from image prompts see what the training forward sees (PaliGemma's two-way prefix over the whole
    prompt, token_type_ids 0; Llama 4's tiles and MoE; Phi-4-multimodal's image_pixel_values and Idefics3's
    pixel_attention_mask: every input the model's forward takes reaches generate()): the sampler's log-probs match
    the trainer's recompute."""
    step = grpo_step_on_image_prompts(tmp_path / "grpo", arch)
    assert math.isfinite(step["loss"]) and step["rollout_logp_diff_max"] < 0.01
