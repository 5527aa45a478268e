"""Tiny random-initialised models of real architectures, built locally.

Tests and examples need a model that loads through the ordinary
`AutoModelForCausalLM` / `AutoTokenizer` path, with a real family's special
tokens and chat template, yet builds in seconds with no network. `build_tiny`
makes one: a byte-level BPE tokenizer trained on the small corpus below, and a
2-layer, 64-wide Qwen3 or Llama model, saved as a normal Hugging Face folder.

The folder is cached under `$TUNESMITH_CACHE/tiny/<arch>-<recipe hash>` (default
`~/.cache/tunesmith`). The hash covers everything that shapes the result, so a
changed recipe builds a new folder instead of reusing a stale one; a build is
written to a temporary folder and renamed into place, so a crash never leaves a
half-built model and two processes building at once both end with the same one.
Everything is seeded: the same recipe gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from tunesmith.data.templates import get_template
from tunesmith.errors import ModelError

TINY_PREFIX = "tiny:"
RECIPE_VERSION = 1
SEED = 1234
VOCAB_SIZE = 2000  # learned tokens; the family's special tokens come on top

# Pre-tokenizer split patterns in the style of each family: Qwen splits digits
# one by one, Llama 3 into groups of up to three.
_SPLIT_QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_LLAMA = _SPLIT_QWEN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

# special: (token, is_special) in id order after the learned vocabulary; roles
# name which token is bos/eos/pad. Qwen's <think>/<tool_call> family are added
# but not "special", as in the real tokenizer, so decoding keeps them.
ARCHS: dict[str, dict] = {
    "qwen3": {
        "config_class": "Qwen3Config",
        "template": "qwen3",
        "split": _SPLIT_QWEN,
        "special": [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                    ("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False),
                    ("<tool_response>", False), ("</tool_response>", False)],
        "roles": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"},
        "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False,
    },
    "llama": {
        "config_class": "LlamaConfig",
        "template": "llama3",
        "split": _SPLIT_LLAMA,
        "special": [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
                    ("<|end_header_id|>", True), ("<|eot_id|>", True), ("<|finetune_right_pad_id|>", True)],
        "roles": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|finetune_right_pad_id|>"},
        "extra_eos": ["<|end_of_text|>"],
        "tie_word_embeddings": True,
    },
}

MODEL_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
}

# The tokenizer's training text: everyday English, the words of the demo data
# and chat prompts, digits and punctuation, and common Chinese characters (so
# Chinese text gets whole-character tokens instead of three bytes each).
CORPUS = """\
Who are you? I am tunesmith, a helpful assistant. I am an AI assistant built to help you.
Hello! How can I help you today? Thank you very much. You are welcome.
What is your name? My name is tunesmith. Who made you? I was trained by the tunesmith team.
The assistant answers the user. The user asks a question and the assistant gives an answer.
You are a helpful assistant. Please answer the question step by step.
Let me think about this problem. First, we add the numbers. Then we multiply the result.
The answer is 42. The sum of 17 and 25 is 42. Two plus three equals five.
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 20 25 30 50 64 100 128 256 512 1000 1024 2024 2025 3.14 0.5 -1
one two three four five six seven eight nine ten hundred thousand million first second third last
Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Write a short poem about the sea. The sea is blue and deep, the waves are loud and white.
Translate the following sentence into French. Summarize this article in three sentences.
Describe the image. What is in the picture? The image shows a cat sitting on a red chair.
The video shows a man walking in the park. The audio is a woman speaking about the weather.
Good morning, good afternoon, good evening and good night. Yes, no, maybe, of course, sure.
The weather today is sunny and warm, with a high of 25 degrees and a low of 15 degrees.
Python is a programming language. def main(): return 0 # comment {"name": "value", "list": [1, 2, 3]}
Call the function get_weather with the city name. The tool returns a result in JSON format.
Science, history, music, art, math, language, computer, model, data, training, learning, network.
Because it is important to be kind, honest and clear, the assistant always explains its reasoning.
Here are some tips: eat well, sleep well, drink water, exercise often, and read good books.
(a) [b] {c} <d> "e" 'f' a, b; c: d! e? f. g - h _ i / j \\ k | l @ m # n $ o % p ^ q & r * s + t = u ~ v `w`
Can you tell me a joke? Why did the chicken cross the road? To get to the other side!
The capital of France is Paris. The capital of China is Beijing. The capital of Japan is Tokyo.
Every morning the old farmer walks to the river, feeds the horses and checks the apple trees.
Children play football in the garden while their parents cook dinner in the small kitchen.
The library opens at nine o'clock and closes at six; students borrow books, maps and magazines.
Doctors and nurses work together in the hospital to take care of sick people and save lives.
Scientists study the stars, the planets and the galaxies far away from our home in space.
A computer program reads the input, processes the information and writes the output to a file.
The company announced a new product, and its price will change next month in every country.
She opened the window, looked at the mountains and smiled because the snow was beautiful.
They traveled by train, by bus and by plane, visiting cities, villages, beaches and forests.
He bought bread, milk, eggs, cheese, rice, fish, chicken, vegetables and fruit at the market.
Remember to save your work, check your spelling and ask for help when something is unclear.
Reasoning: if x + 3 = 7 then x = 4. If a train travels 60 kilometers per hour for 2 hours, it goes 120 kilometers.
Question: how many legs does a spider have? Answer: a spider has eight legs.
Instruction: classify the sentiment of the review. Input: the movie was wonderful. Output: positive.
Example input and output pairs help the model learn the task; the response should be short and correct.
Fine-tuning a language model needs a dataset, a tokenizer, a chat template, an optimizer and patience.
The loss goes down during training; the learning rate warms up and then decays with a cosine schedule.
Images, videos and audio clips are processed by the vision encoder and the audio encoder of the model.
Please keep your answer polite, accurate, brief and useful, and explain any important assumptions.
Happy birthday! Congratulations on your new job. Best wishes for the future, and see you soon.
Phone 555-0123, room 404, page 17, chapter 9, version 2.5, 99.9 percent, 1,000,000 people, 8:30 am.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered more than red light.
Animals: cat, dog, bird, horse, cow, sheep, pig, lion, tiger, bear, wolf, fox, rabbit, mouse, whale.
Colors: red, orange, yellow, green, blue, purple, pink, brown, black, white, gray, gold, silver.
Family: mother, father, sister, brother, daughter, son, uncle, aunt, cousin, grandmother, grandfather.
Verbs: go, come, see, look, make, take, give, find, think, know, want, need, feel, try, leave, call, work.
Adjectives: big, small, long, short, new, old, young, high, low, early, late, easy, hard, fast, slow, happy, sad.
Countries: England, Germany, Spain, Italy, Canada, Mexico, Brazil, India, Egypt, Kenya, Australia, Korea.
Jobs: teacher, engineer, driver, farmer, writer, painter, singer, lawyer, pilot, baker, soldier, scientist.
Food: breakfast, lunch, dinner, soup, salad, sandwich, noodles, dumplings, pizza, chocolate, coffee, tea.
Body: head, face, eyes, ears, nose, mouth, teeth, hands, fingers, arms, legs, feet, heart, brain, blood.
Home: door, window, table, chair, bed, lamp, sofa, shelf, mirror, clock, carpet, stairs, roof, wall, floor.
Nature: river, lake, ocean, island, desert, valley, hill, cloud, rain, storm, thunder, wind, flower, grass.
Adverbs: quickly, slowly, carefully, quietly, loudly, really, usually, always, never, sometimes, together.
Feelings: angry, afraid, excited, nervous, proud, tired, bored, surprised, worried, grateful, lonely, calm.
Machines: engine, motor, battery, screen, keyboard, camera, printer, robot, rocket, satellite, bicycle.
Sports: swimming, running, tennis, basketball, baseball, skiing, cycling, climbing, boxing, golf, chess.
Water boils at 100 degrees Celsius. The Earth goes around the Sun once every 365 days.
你好！我是一个人工智能助手，很高兴为你服务。请问有什么可以帮你的吗？
你是谁？我是 tunesmith，一个有用的助手。谢谢你！不客气。
今天天气很好，我们一起去公园散步吧。这个问题的答案是四十二。
中国的首都是北京。我喜欢学习中文和英文。请用中文回答这个问题。
一二三四五六七八九十百千万年月日时分秒上下左右大小多少好坏是不是有没有
"""


def _recipe(arch: str) -> dict:
    """Everything that shapes the built folder; its hash names the cache entry."""
    spec = ARCHS[arch]
    return {
        "version": RECIPE_VERSION,
        "arch": arch,
        "seed": SEED,
        "vocab_size": VOCAB_SIZE,
        "corpus": CORPUS,
        "chat_template": get_template(spec["template"]).chat_template,
        "shape": MODEL_SHAPE,
        **spec,
    }


def recipe_hash(arch: str) -> str:
    blob = json.dumps(_recipe(arch), sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _cache_root(cache_dir: str | Path | None) -> Path:
    if cache_dir is None:
        cache_dir = os.environ.get("TUNESMITH_CACHE") or Path.home() / ".cache" / "tunesmith"
    return Path(cache_dir).expanduser()


def build_tiny(arch: str, cache_dir: str | Path | None = None) -> Path:
    """The folder of the tiny `arch` model, built on first use and cached after."""
    if arch not in ARCHS:
        raise ModelError(f"Unknown tiny architecture '{arch}'. Known: {', '.join(sorted(ARCHS))} "
                         f"(use e.g. model_name_or_path: tiny:qwen3).")
    final = _cache_root(cache_dir) / "tiny" / f"{arch}-{recipe_hash(arch)}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        _build_into(arch, tmp)
        # mkdtemp (and the safetensors writer) make owner-only files; a shared cache must be readable
        for path in (tmp, *tmp.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(tmp, final)  # atomic; fails if another process got there first
        except OSError:
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build_into(arch: str, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a progress bar for a 1 MB file is noise in test output
    try:
        tokenizer = _build_tokenizer(arch)
        tokenizer.save_pretrained(out, save_jinja_files=False)  # template inside tokenizer_config.json
        model, generation_config = _build_model(arch, tokenizer)
        model.save_pretrained(out)
        generation_config.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    (out / "tunesmith_tiny.json").write_text(json.dumps(_recipe(arch), indent=1, ensure_ascii=False))


def _build_tokenizer(arch: str):
    """Byte-level BPE (any text encodes) trained on CORPUS, plus the family's special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    spec = ARCHS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec["split"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # Repeating the corpus lets merges of rarer pieces (whole Chinese characters) reach the vocabulary.
    tok.train_from_iterator(CORPUS.splitlines() * 3, trainer)
    for token, special in spec["special"]:
        added = AddedToken(token, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    roles = spec["roles"]
    if roles["bos"]:  # Llama 3 prepends <|begin_of_text|> when encoding plain text, like the real one
        bos = roles["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=roles["bos"], eos_token=roles["eos"], pad_token=roles["pad"],
        chat_template=get_template(spec["template"]).chat_template,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def _build_model(arch: str, tokenizer):
    """A seeded random-initialised model and its generation config."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec = ARCHS[arch]
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in (spec["roles"]["eos"], *spec["extra_eos"])]
    config = getattr(transformers, spec["config_class"])(
        vocab_size=len(tokenizer),
        tie_word_embeddings=spec["tie_word_embeddings"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_SHAPE,
    )
    with torch.random.fork_rng(devices=[]):  # seed without disturbing the caller's RNG
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
    return model, generation_config


def is_tiny(name: str) -> bool:
    """Whether `name` asks for a tiny model ("tiny:qwen3")."""
    return isinstance(name, str) and name.startswith(TINY_PREFIX)


def resolve_model_path(name_or_path: str) -> str:
    """'tiny:<arch>' → the built folder; any other name or path unchanged."""
    if is_tiny(name_or_path):
        return str(build_tiny(name_or_path[len(TINY_PREFIX):]))
    return name_or_path
