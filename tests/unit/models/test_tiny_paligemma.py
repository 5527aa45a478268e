"""Tiny PaliGemma 2: tunesmith's data path and chat path give the model exactly what PaliGemmaProcessor gives it
(tokens, the prefix/suffix token types, 1-based positions), so training computes transformers' own loss; packing is
refused; the language model (Gemma 2) runs eager attention."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from conftest import DATA_DIR, run_config
from tunesmith.data.collate import collate_rows
from tunesmith.errors import ModelError
from tunesmith.models.families import FAMILIES, GROUPS, family_of, module_groups
from tunesmith.models.forward import run_forward
from tunesmith.models.inputs import model_inputs
from tunesmith.models.tiny import build_tiny

IMAGE = DATA_DIR / "mllm_demo_data" / "image_000.png"


@pytest.fixture(scope="module")
def path(tiny_cache):
    return build_tiny("paligemma", tiny_cache)


@pytest.fixture(scope="module")
def loaded(path):
    return AutoProcessor.from_pretrained(path), AutoModelForImageTextToText.from_pretrained(path).eval()


def _data(**overrides):
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.load import load_preprocessing

    cfg = run_config("/tmp/unused", model_name_or_path="tiny:paligemma", template="paligemma",
                     **{"dataset": "mllm_demo", "cutoff_len": 512, "max_samples": 2, **overrides})
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media).train
    return data, tokenizer, media


def test_folder_loads_and_its_family_covers_every_parameter(loaded):
    processor, model = loaded
    assert type(processor).__name__ == "PaliGemmaProcessor"
    assert type(model).__name__ == "PaliGemmaForConditionalGeneration"
    assert model.config.get_text_config().model_type == "gemma2"
    family = family_of(model)
    assert family is FAMILIES["paligemma"] and family.prefix_lm and family.modalities == ("image",)
    groups = module_groups(model, family)
    assert set(groups) == set(GROUPS)
    names = [n for group in groups.values() for n in group]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters()) and len(names) == len(set(names))


def test_a_training_sample_is_what_the_processor_makes_of_prompt_and_suffix_and_the_loss_is_transformers(
        loaded, tmp_path):
    """The processor's own training inputs (text + suffix) against our rendered, expanded, collated sample of one
    turn: the same ids and token types, and our forward (positions from 1, the two-way prefix) gives
    transformers' loss."""
    processor, model = loaded
    record = {"messages": [{"role": "user", "content": "<image>caption en"},
                           {"role": "assistant", "content": "A purple square and a red triangle."}],
              "images": [str(IMAGE)]}
    (tmp_path / "one.json").write_text(json.dumps([record]))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"one": {
        "file_name": "one.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    data, tokenizer, media = _data(dataset="one", dataset_dir=str(tmp_path))
    record = data[0]
    batch = collate_rows([[{"input_ids": record["input_ids"], "labels": record["labels"],
                            "mm_plan": record["mm_plan"]}]], tokenizer.pad_token_id, media=media)
    text = tokenizer.decode(record["input_ids"])
    prompt, answer = text.split("<bos>", 1)[1].split("\n", 1)
    images = [Image.open(i["path"]).convert("RGB") for i in json.loads(record["mm_plan"])["images"]]
    assert images and text.startswith("<image>" * processor.image_seq_length * len(images) + "<bos>")
    hf = processor(text=["<image>" * len(images) + prompt], images=images, suffix=[answer.removesuffix("<eos>")],
                   return_tensors="pt")
    assert batch.input_ids_BT[0].tolist() == hf["input_ids"][0].tolist()
    ours = model_inputs(model, batch)
    assert ours["token_type_ids"][0].tolist() == hf["token_type_ids"][0].tolist()
    assert ours["position_ids"][0, 0] == 1
    with torch.no_grad():
        theirs = model(**hf).loss
        logits = run_forward(model, batch, "logits").logits_BTV
    targets = batch.targets_BT[0]
    ours_loss = torch.nn.functional.cross_entropy(logits[0][targets != -100], targets[targets != -100])
    torch.testing.assert_close(ours_loss, theirs, rtol=1e-5, atol=1e-5)


def test_the_chat_prompt_is_what_the_processor_makes_of_the_prompt(path, loaded):
    from tunesmith.infer.media import MediaInputs
    from tunesmith.serve.render import model_inputs as chat_inputs

    processor, _ = loaded
    media = MediaInputs(images=[Image.open(IMAGE).convert("RGB")])
    ours = chat_inputs(processor, [{"role": "user", "content": "<image>caption en"}], media).inputs
    hf = processor(text=["<image>caption en"], images=media.images, return_tensors="pt")
    for key in ("input_ids", "token_type_ids", "pixel_values"):
        torch.testing.assert_close(ours[key], hf[key], rtol=0, atol=0)
    text_only = chat_inputs(processor, [{"role": "user", "content": "caption en"}]).inputs  # the processor itself refuses a prompt without images
    assert text_only["input_ids"][0].tolist() == processor.tokenizer("<bos>caption en\n", add_special_tokens=False)[
        "input_ids"]


def test_packing_is_refused_and_attention_is_eager(path):
    from tunesmith.models.load import attn_implementation, load_config

    with pytest.raises(ModelError, match="two-way attention over the prompt"):
        _data(neat_packing=True)
    cfg = run_config("/tmp/unused", model_name_or_path="tiny:paligemma", dataset="mllm_demo")
    assert attn_implementation(cfg.model, torch.device("cpu"), load_config(cfg.model)) == "eager"


def test_generation_continues_the_prompt_prefix(loaded):
    processor, model = loaded
    image = Image.fromarray(np.random.RandomState(0).randint(0, 256, (96, 128, 3), dtype=np.uint8))
    inputs = processor(text=["<image>caption en"], images=[image], return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert ids.shape[1] == inputs["input_ids"].shape[1] + 3
