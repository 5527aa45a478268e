"""LLaVA end to end through the real CLI, on the shipped image demos (tiny:llava: LLaVA-1.5; tiny:llava_next:
LLaVA-NeXT, anyres tiles; tiny:llava_next_video: LLaVA-NeXT-Video, also on the video demo; tiny:llava_next_mistral,
_qwen, _llama3, _yi: LLaVA-NeXT on other language models, with their chat formats).

Default run: full SFT (vision tower and projector trained too, packed rows), chat about an image with the result,
and the saved folder loads in plain transformers (Llava(Next)ForConditionalGeneration) and answers as the chat did.
Slow: LoRA SFT mixing image and text-only records, chat with the adapter, a DPO step on the image pairs,
and a GRPO step on image prompts.
"""

import math

import pytest
import torch

from test_cli import DATA, cli, grpo_step_on_image_prompts, metrics

IMAGE = f"{DATA}/mllm_demo_data/image_000.png"
BASE = [f"dataset_dir={DATA}", "cutoff_len=1024", "logging_steps=1"]
# VARIANTS: LLaVA-NeXT on Mistral, Qwen2, Llama 3 and Yi (Llama-architecture) language models, their chat formats
VARIANTS = ["llava_next_mistral", "llava_next_qwen", "llava_next_llama3", "llava_next_yi"]
VIDEO_VARIANTS = ["llava_next_video_mistral", "llava_next_video_yi"]
ARCHS = ["llava", "llava_next", "llava_next_video", *VARIANTS, *VIDEO_VARIANTS]
MODEL_TYPE = {**dict.fromkeys(VARIANTS, "llava_next"), **dict.fromkeys(VIDEO_VARIANTS, "llava_next_video")}
MODEL_CLASS = {"llava": "LlavaForConditionalGeneration", "llava_next": "LlavaNextForConditionalGeneration",
               "llava_next_video": "LlavaNextVideoForConditionalGeneration",
               **dict.fromkeys(VARIANTS, "LlavaNextForConditionalGeneration"),
               **dict.fromkeys(VIDEO_VARIANTS, "LlavaNextVideoForConditionalGeneration")}
# the 128x96 demo image: a fixed crop; the base view and 2x2 tiles (28-pixel tiles; 56-pixel for the video model)
NUM_IMAGE_TOKENS = {"llava": 9, "llava_next": 24, "llava_next_video": 70, **dict.fromkeys(VARIANTS, 24),
                    **dict.fromkeys(VIDEO_VARIANTS, 70)}
VIDEO = f"{DATA}/mllm_demo_data/video_000.mp4"
# the default run keeps to about 30 s on the CPU: one arch; the other runs in the slow suite
ONE_FAST = [ARCHS[0], *(pytest.param(arch, marks=pytest.mark.slow) for arch in ARCHS[1:])]
PROMPT = "Describe the image."


def _losses(out):
    return [m["loss"] for m in metrics(out) if "loss" in m]


def _chat(out):
    answer = cli("chat", "--model", out, "--image", IMAGE, "--prompt", PROMPT, "--max_new_tokens", "6")
    assert answer.returncode == 0 and "Traceback" not in answer.stderr
    return answer.stdout.strip()  # a tiny model may answer </s> at once: compared with transformers' answer below


def _plain_transformers_answer(out, arch) -> str:
    import transformers
    from PIL import Image
    from transformers import AutoProcessor

    model = getattr(transformers, MODEL_CLASS[arch]).from_pretrained(out).eval()
    processor = AutoProcessor.from_pretrained(out)
    assert model.config.model_type == MODEL_TYPE.get(arch, arch)
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}],
        tokenize=False, add_generation_prompt=True)
    # the template writes <s> itself, as in training (the Qwen one writes none)
    image = Image.open(IMAGE).convert("RGB")
    inputs = processor(text=[text], images=[image], add_special_tokens=False, return_tensors="pt")
    expected = processor._get_num_multimodal_tokens(image_sizes=[image.size[::-1]])["num_image_tokens"][0]
    assert int((inputs["input_ids"] == processor.image_token_id).sum()) == expected == NUM_IMAGE_TOKENS[arch]
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    return processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()


@pytest.mark.parametrize("arch", ONE_FAST)
def test_llava_full_sft_chat_and_plain_transformers_answer_alike(tmp_path, arch):
    out = tmp_path / "full"
    proc = cli("train", f"model_name_or_path=tiny:{arch}", *BASE, "dataset=mllm_demo", "finetuning_type=full",
               "freeze_vision_tower=false", "freeze_multi_modal_projector=false", "learning_rate=1e-3", "max_steps=6",
               f"output_dir={out}")
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "vision_tower 0/" not in said and "projector 0/" not in said  # both trained
    losses = _losses(out)
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert _chat(out) == _plain_transformers_answer(out, arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_llava_lora_sft_with_text_records_chat_then_a_dpo_step(tmp_path, arch):
    lora, dpo = tmp_path / "lora", tmp_path / "dpo"
    cli("train", f"model_name_or_path=tiny:{arch}", *BASE, "dataset=mllm_demo,identity", "finetuning_type=lora",
        "freeze_vision_tower=false", "per_device_train_batch_size=2", "max_steps=3", f"output_dir={lora}")
    assert (lora / "adapter_config.json").is_file() and len(_losses(lora)) == 3
    _chat(lora)
    cli("train", f"model_name_or_path=tiny:{arch}", *BASE, "stage=dpo", "dataset=mllm_dpo_demo",
        "finetuning_type=lora", "max_steps=1", f"output_dir={dpo}")
    [loss] = _losses(dpo)
    assert loss == pytest.approx(math.log(2), abs=1e-3)  # the first step: policy == reference


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_llava_one_grpo_step_on_image_prompts(tmp_path, arch):
    """Rollouts see the images (and LLaVA-NeXT's image_sizes): their log-probs match the training forward's."""
    step = grpo_step_on_image_prompts(tmp_path / "grpo", arch)
    assert math.isfinite(step["loss"]) and step["rollout_logp_diff_max"] < 0.01


@pytest.mark.parametrize("arch", ["llava_next_video", *(pytest.param(a, marks=pytest.mark.slow)
                                                       for a in VIDEO_VARIANTS)])
def test_llava_next_video_full_sft_on_videos_and_images_then_plain_transformers_and_chat_see_the_video(tmp_path,
                                                                                                     arch):
    """Every frame's 4 <video> tokens (56-pixel crop, 4x4 patches pooled 2x2) get its features, in training and
    when the saved folder generates in plain transformers; `tunesmith chat --video` answers. Also LLaVA-NeXT-Video
    on Mistral and Yi language models, with their chat formats."""
    import transformers
    from transformers import AutoProcessor

    from tunesmith.data.media import load_video

    out = tmp_path / "full"
    cli("train", f"model_name_or_path=tiny:{arch}", *BASE, "dataset=mllm_video_demo,mllm_demo",
        "video_max_pixels=4096", "finetuning_type=full", "freeze_vision_tower=false", "learning_rate=1e-3",
        "max_steps=4", "per_device_train_batch_size=2", f"output_dir={out}")
    losses = _losses(out)
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    model = transformers.LlavaNextVideoForConditionalGeneration.from_pretrained(out).eval()
    processor = AutoProcessor.from_pretrained(out)
    frames = load_video(VIDEO, fps=2.0, maxlen=8, max_pixels=4096, min_pixels=None, multiple=1).frames
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}],
        tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], videos=[frames], add_special_tokens=False, return_tensors="pt")
    assert int((inputs["input_ids"] == processor.video_token_id).sum()) == 4 * len(frames)
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert ids.shape[1] > inputs["input_ids"].shape[1]
    answer = cli("chat", "--model", out, "--video", VIDEO, "--prompt", "What happens?", "--max_new_tokens", "4")
    assert answer.returncode == 0 and "Traceback" not in answer.stderr
