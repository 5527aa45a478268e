"""What every tiny model shares: the recipe constants, the tokenizer corpus, and the building steps.

A family module (qwen3.py, qwen_vl.py, ...) only describes its archs as plain
data (a spec: its special tokens, chat template, processor and encoder sizes);
the steps here turn a spec into a tokenizer, a processor and a seeded model.
Specs are hashed into the recipe, so they hold no code.
"""

from __future__ import annotations

from tunesmith.data.templates import get_template
from tunesmith.errors import ModelError

RECIPE_VERSION = 1
SEED = 1234
VOCAB_SIZE = 2000  # learned tokens; the family's special tokens come on top

# Pre-tokenizer split patterns in the style of each family: Qwen splits digits
# one by one, Llama 3 into groups of up to three.
SPLIT_QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLIT_LLAMA = SPLIT_QWEN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

# The special tokens every Qwen tokenizer starts with, in the real id order, and
# which of them is bos/eos/pad.
CHATML = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True)]
QWEN_TOOLS = [("<tool_call>", False), ("</tool_call>", False)]
CHATML_ROLES = {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"}

# Media budgets: images between 4 and 64 merged tokens (a 56x84 image is 2x3
# merged 2x2 patches = 6 tokens); video frames the same per frame. Like the real
# checkpoints, the video processors leave `cap_pixels_per_frame` unset (per-frame
# budget for Qwen2-VL's, one budget over all frames for Qwen3-VL's).
VISION_PIXELS_14 = {"size": {"shortest_edge": 4 * 28 * 28, "longest_edge": 64 * 28 * 28}}
NUM_MEL_BINS = 32

# The text model of every multimodal arch: MODEL_SHAPE with mRoPE. mrope_section
# splits head_dim / 2 = 8 rotary frequencies into (temporal, height, width),
# contiguous as in the real models (16/24/24 of 64); Qwen3-VL interleaves them (qwen_vl.py).
MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]}

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


def chat_template(spec: dict) -> str:
    """A text arch names one of tunesmith's templates; a multimodal one carries its own Jinja."""
    return spec["chat_template_text"] if "chat_template_text" in spec else get_template(spec["template"]).chat_template


def build_tokenizer(spec: dict):
    """Byte-level BPE (any text encodes) trained on CORPUS, plus the family's special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

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
        chat_template=chat_template(spec),
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        **spec.get("token_attrs", {}),
    )


def build_processor(spec: dict, tokenizer):
    """The family's processor around `tokenizer`: image/video processors and/or a Whisper feature extractor."""
    import transformers

    parts = {}
    for key in ("image_processor", "video_processor", "feature_extractor", "audio_processor"):
        if key in spec:
            kwargs = dict(spec[key])
            component = getattr(transformers, kwargs.pop("class"))
            if hasattr(component, "merge_size"):  # Qwen-VL style processors merge 2x2 patches, 2 frames
                kwargs.update(merge_size=2, temporal_patch_size=2)
            parts[key] = component(**kwargs)
    processor_class = getattr(transformers, spec["processor_class"])
    return processor_class(tokenizer=tokenizer, chat_template=chat_template(spec), **parts,
                           **spec.get("processor_kwargs", {}))


def generation_config(spec: dict, tokenizer):
    """Generation stops at the family's eos and its extra stop tokens, as the real generation_config.json does."""
    from transformers import GenerationConfig

    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in (spec["roles"]["eos"], *spec["extra_eos"])]
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)


def build_text_model(spec: dict, tokenizer):
    """A seeded random-initialised causal LM of MODEL_SHAPE (text-only archs).

    `spec["config"]` holds the family's own config keys (sliding-window layer types,
    experts, MLA ranks, ...) on top of MODEL_SHAPE, which it may override.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config = getattr(transformers, spec["config_class"])(
        vocab_size=len(tokenizer),
        tie_word_embeddings=spec["tie_word_embeddings"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**MODEL_SHAPE, **spec.get("config", {})},
    )
    with torch.random.fork_rng(devices=[]):  # seed without disturbing the caller's RNG
        torch.manual_seed(SEED)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def build_mm_model(spec: dict, config):
    """A seeded random-initialised `spec["model_class"]`, then the spec's `init_std` overrides drawn in order."""
    import torch
    import transformers

    model_class = getattr(transformers, spec["model_class"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = model_class._from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, std in spec.get("init_std", {}).items():
                model.get_parameter(name).normal_(0.0, std)
    return model


def text_config(spec: dict, tokenizer, **extra) -> dict:
    """The language model's config: MODEL_SHAPE, the tokenizer's ids, and mRoPE where the family has it."""
    shape = {k: v for k, v in MODEL_SHAPE.items() if k != "head_dim"}  # most derive it: hidden / heads = 16
    shape.update(extra)
    if "rope" in spec:
        shape["rope_parameters"] = dict(spec["rope"])
    return {
        **shape,
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": spec["tie_word_embeddings"],
    }


def token_ids(tokenizer, **tokens: str) -> dict[str, int]:
    """{config key: token id}; every token must be a single known token (a typo must not become an id)."""
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items()}
    unknown = [tokens[k] for k, i in ids.items() if i is None or tokenizer.convert_ids_to_tokens(i) != tokens[k]]
    if unknown:
        raise ModelError(f"The tiny tokenizer lacks the tokens {unknown}.")
    return ids
