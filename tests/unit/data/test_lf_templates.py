"""Every template name of LLaMA-Factory's registry resolves: a built-in Jinja, the tokenizer's own template
(LF's *_nothink names with enable_thinking=false), or an error naming the family and the fix."""

import ast
import os
from pathlib import Path

import pytest
import yaml

from tunesmith.data.lf_templates import BUILTIN, LF_TEMPLATES, OWN, REFUSED, _ROWS, templates_of_family
from tunesmith.data.templates import TEMPLATES, get_template, resolve
from tunesmith.errors import ModelError
from tunesmith.models.families import FAMILIES, TEXT_FAMILIES
from tunesmith.models.tiny.build import ARCHS
from tunesmith.models.tiny.common import build_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "llamafactory" / "examples"

# The names `register_template(name=...)` registers in LLaMA-Factory 0.9.5's src/llamafactory/data/template.py.
LF_0_9_5 = """
alpaca bailing bailing_v2 breeze chatglm3 chatml chatml_de cohere cpm4 dbrx deepseek deepseek3 deepseekr1 hy3
deepseekcoder default dots_ocr empty ernie ernie_nothink ernie_vl exaone falcon falcon_h1 fewshot gemma gemma2
gemma3 gemma3n gemma4 gemma4n glm4 glm4_moe glm4v glm4_5v glm_ocr glm4_7 glmz1 gpt_oss granite3 granite3_vision
granite4 index hunyuan hunyuan_small intern2 intern_vl intern_s1 keye_vl kimi_vl lfm2 lfm2_vl llama2 llama2_zh
llama3 llama4 mllama moonlight llava llava_next llava_next_llama3 llava_next_mistral llava_next_qwen llava_next_yi
llava_next_video llava_next_video_mistral llava_next_video_yi mimo mimo_v2 mimo_vl minicpm_v minicpm_v_4_6
minicpm_o minimax1 minimax2 ministral mistral mistral_small ministral3 olmo openchat openchat-3.6 opencoder
paligemma paligemma_chat phi phi_small phi4 phi4_mini pixtral qwen qwen3 qwen3_nothink qwen2_audio qwen2_omni
qwen3_omni qwen3_omni_nothink qwen2_vl qwen3_vl qwen3_vl_nothink qwen3_5 qwen3_5_nothink qwen3_6 sailor seed_coder
seed_oss smollm smollm2 solar starchat telechat2 vicuna video_llava xuanyuan yi yi_vl youtu youtu_vl yuan zephyr
aeva
""".split()

# The tiny builder of each supported family key (models/tiny/), to check the family tokens against.
TINY_OF = {"qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "llama": "llama", "gemma3": "gemma3", "mistral": "mistral",
           "phi3": "phi4", "glm4": "glm4", "glm4_moe": "glm4_moe", "glm4v_moe": "glm4v_moe", "llava_next_video": "llava_next_video", "paligemma": "paligemma", "qwen3_vl_moe": "qwen3_vl_moe", "deepseek_v3": "deepseek_v3", "gpt_oss": "gpt_oss", "qwen3_5": "qwen3_5",
           "qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl", "qwen2_audio": "qwen2_audio",
           "qwen2_5_omni": "qwen2_5_omni", "gemma3_vl": "gemma3_vl", "phi4_multimodal": "phi4_multimodal",
           "pixtral": "pixtral", "gemma3n": "gemma3n"}


def _lf_source() -> Path | None:
    """LLaMA-Factory's template.py where it is installed (optional; not in CI)."""
    path = Path(os.environ.get("TUNESMITH_LF_SITE") or "/tmp/lfsite") / "llamafactory" / "data" / "template.py"
    return path if path.exists() else None


def _registered_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [kw.value.value for node in tree.body
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "register_template"
            for kw in node.value.keywords if kw.arg == "name"]


def test_every_lf_0_9_5_name_has_one_row():
    assert len(LF_TEMPLATES) == len(_ROWS), "a name is listed twice"
    assert set(LF_0_9_5) <= set(LF_TEMPLATES), sorted(set(LF_0_9_5) - set(LF_TEMPLATES))
    assert set(LF_TEMPLATES) - set(LF_0_9_5) == {"moss_vl"}  # from newer LF example configs


def test_the_installed_llamafactory_registers_no_name_we_lack():
    path = _lf_source()
    if path is None:
        pytest.skip("LLaMA-Factory is not installed (set TUNESMITH_LF_SITE to its site-packages folder)")
    names = _registered_names(path)
    assert len(names) > 100
    assert set(names) <= set(LF_TEMPLATES), sorted(set(names) - set(LF_TEMPLATES))


@pytest.mark.parametrize("name", sorted(LF_TEMPLATES))
def test_every_name_resolves_or_names_its_family(name):
    row = LF_TEMPLATES[name]
    if row.use == REFUSED:
        with pytest.raises(ModelError) as err:
            get_template(name)
        message = str(err.value)
        assert f"'{name}'" in message and row.family in message and "template: auto" in message
        assert "Unknown template" not in message
        assert not row.family_keys
        return
    spec = get_template(name)
    assert spec.name == name and row.family_keys
    if row.use == BUILTIN:
        assert spec is TEMPLATES[name] and spec.chat_template
    else:
        assert spec.chat_template is None  # the tokenizer's own
        assert spec.render_kwargs == ({"enable_thinking": False} if name.endswith("_nothink") else {})


def test_family_keys_are_families_of_models_families_py():
    known = set(FAMILIES) | set(TEXT_FAMILIES)
    for row in _ROWS:
        assert set(row.family_keys) <= known, (row.name, row.family_keys)
    # every supported family is reachable by some LF name (LLaMA-Factory has none for Idefics3 / SmolVLM,
    # SmolVLM2 and LLaVA-OneVision)
    assert {key for row in _ROWS for key in row.family_keys} >= known - {"qwen4_exp", "idefics3", "smolvlm",
                                                                         "llava_onevision"}
    assert templates_of_family("qwen3_vl") == ["qwen3_vl_nothink", "qwen3_vl"]


def _example_templates():
    found = {}
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("template"), str):
            found.setdefault(data["template"], str(path.relative_to(EXAMPLES)))
    return found


def test_lf_example_configs_never_name_an_unknown_template():
    found = _example_templates()
    assert {"qwen3_vl", "qwen2_vl", "qwen3_5", "qwen3_5_nothink", "deepseek3", "deepseek", "llama2",
            "moss_vl"} <= set(found)
    for name, path in found.items():
        try:
            get_template(name)
        except ModelError as err:
            assert "Unknown template" not in str(err), (path, str(err))
            assert LF_TEMPLATES[name].family in str(err)


@pytest.mark.parametrize("typo, close", [("qwen3_5_no_think", "qwen3_5_nothink"), ("deepseek_3", "deepseek3"),
                                         ("gemma_3", "gemma3")])
def test_unknown_names_suggest_the_closest_lf_name(typo, close):
    with pytest.raises(ModelError, match=f"Unknown template '{typo}'. Did you mean '{close}'"):
        get_template(typo)


@pytest.fixture(scope="module")
def tokenizers():
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = build_tokenizer(ARCHS[arch])
        return cache[arch]
    return get


@pytest.mark.parametrize("name", sorted(n for n, row in LF_TEMPLATES.items() if row.use == OWN and row.tokens))
def test_own_names_accept_their_familys_tokenizer(name, tokenizers):
    row = LF_TEMPLATES[name]
    # a tiny build of the name's own (LLaVA-NeXT on Mistral is tiny:llava_next_mistral), else the family's
    archs = [name] if name in ARCHS else [TINY_OF[k] for k in row.family_keys if k in TINY_OF]
    for arch in archs:
        tok = tokenizers(arch)
        template, kwargs = resolve(tok, name)
        assert template == tok.chat_template


def test_an_own_name_refuses_a_tokenizer_of_another_family(tokenizers):
    with pytest.raises(ModelError, match=r"Template 'gemma3' is for Gemma 3 \(text and vision\) models.*<start_of_turn>"):
        resolve(tokenizers("qwen3"), "gemma3")
    with pytest.raises(ModelError, match="Template 'deepseek3' is for DeepSeek-V3 models"):
        resolve(tokenizers("llama"), "deepseek3")


def test_nothink_forces_enable_thinking_off_in_the_data_path(tokenizers):
    from tunesmith.config.load import build_config
    from tunesmith.data.pipeline import render_options

    cfg = build_config(None, {"model_name_or_path": "tiny:qwen3_5", "dataset": "identity",
                              "template": "qwen3_5_nothink", "enable_thinking": True, "output_dir": "/tmp/unused"})
    opts = render_options(cfg, tokenizers("qwen3_5"))
    assert opts.chat_template == tokenizers("qwen3_5").chat_template
    assert opts.render_kwargs["enable_thinking"] is False
    cfg = build_config(None, {"model_name_or_path": "tiny:qwen3_5", "dataset": "identity", "template": "qwen3_5",
                              "enable_thinking": False, "output_dir": "/tmp/unused"})
    assert render_options(cfg, tokenizers("qwen3_5")).render_kwargs["enable_thinking"] is False


def test_serving_an_own_name_uses_the_adapters_template_and_forces_thinking_off(tokenizers):
    from tunesmith.serve.render import Rendering

    tok = tokenizers("qwen3_5")
    rendering = Rendering.of(tok, "qwen3_5_nothink", enable_thinking=True, own_template="{{ 'saved' }}")
    assert rendering.chat_template == "{{ 'saved' }}"  # the template a run saved beside its adapter
    assert rendering.kwargs == {"enable_thinking": False}
    assert Rendering.of(tok, "qwen3_5", enable_thinking=False).kwargs == {"enable_thinking": False}
    assert Rendering.of(tok, "qwen3_5").chat_template is None  # the tokenizer's own


def test_plain_text_pretraining_needs_no_chat_template(tiny_qwen3, tmp_path):
    """stage pt renders text + eos: a base model without a chat template, or LLaMA-Factory's default/empty formats,
    are fine there (LLaMA-Factory falls back to its empty template); sft still refuses them."""
    from transformers import AutoTokenizer

    from tunesmith.config.load import build_config
    from tunesmith.data.pipeline import render_options, stage_template
    from tunesmith.errors import ConfigError

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    tok.chat_template = None
    for template in ("auto", "default", "empty"):
        cfg = build_config(None, {"dataset": "c4_demo", "stage": "pt", "template": template})
        assert stage_template(cfg, tok) is None and render_options(cfg, tok).chat_template is None
    with pytest.raises(ConfigError, match="template: Template 'default'"):
        build_config(None, {"dataset": "identity", "template": "default"})
    from tunesmith.errors import ModelError

    with pytest.raises(ModelError, match="Did you mean 'qwen'"):  # a misspelt name is still an error for pt
        stage_template(build_config(None, {"dataset": "c4_demo", "stage": "pt", "template": "qwne"}), tok)
    with_own = AutoTokenizer.from_pretrained(tiny_qwen3)
    assert stage_template(build_config(None, {"dataset": "c4_demo", "stage": "pt"}), with_own) == "auto"
