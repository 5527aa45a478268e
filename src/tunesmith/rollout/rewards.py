"""Reward functions for online RL (GRPO and friends), and how a config combines them.

Every reward function has one signature:

    fn(prompts: list[str], responses: list[str], samples: list[dict], **kwargs) -> list[float]

with one entry per response: `prompts[i]` is the prompt that produced `responses[i]` and
`samples[i]` its dataset row (a group of G responses repeats its prompt and row G times).
Rows carry the columns a reward needs: `answer` for `accuracy`, `target_box` for
`grounding` (at the top level, or inside a Sample's `extra` JSON text). Keyword arguments come from the reward's entry in the config (`pattern`,
`max_len`, ...) and from the trainer (`lengths`: response lengths in tokens); a function
must accept, and may ignore, keywords it does not use.

Built in (`REWARDS`):

- `accuracy`   1/0: the response's final answer equals the row's `answer` (math-verify when installed)
- `format`     1/0: the response matches a regex (default: <think>…</think> then <answer>…</answer>)
- `length`     0 … −1: DAPO's overlong penalty
- `grounding`  GUI grounding: a predicted point inside `target_box` (1/0), or a box's IoU with it
- `reward_model`  a reward model trained with `stage: rm`, through a RewardShaper

A config lists rewards by name, as `module.path:function` for a user's own function, or as
`{"name": ..., "weight": ..., **kwargs}`; `build_rewards` turns that list into one callable
returning the weighted total and each function's rewards (for logging).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import re
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any, Callable

RewardFn = Callable[..., list[float]]

# ---------------------------------------------------------------- answer extraction

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A number not glued to a word before it ("x2" is no number; "12-5" ends with 5, not -5):
# optional minus, thousands groups or plain digits, decimals, an optional /denominator.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\w])")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


def extract_answer(response: str) -> str:
    """The final answer of a response.

    The content of the last <answer>...</answer> if there is one (and inside it the last
    \\boxed{} if it has one), else the last \\boxed{...}, else the last number, else the
    last non-empty line. "" for an empty response.
    """
    tagged = _ANSWER_TAG.findall(response)
    if tagged:
        inner = tagged[-1]
        boxed = last_boxed(inner)
        return (boxed if boxed is not None else inner).strip()
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed.strip()
    numbers = _NUMBER.findall(response)
    if numbers:
        return numbers[-1]
    lines = [line.strip() for line in response.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalize_answer(text: str) -> str:
    """strip, lowercase, drop surrounding $…$ and \\text{…}, a trailing period, thousands commas."""
    s = str(text).strip().lower()
    if len(s) >= 2 and s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip()
    m = re.fullmatch(r"\\text\{(.*)\}", s)
    if m:
        s = m.group(1).strip()
    s = s.rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def _as_number(s: str) -> Fraction | None:
    try:
        return Fraction(s)  # "12", "-3", "0.75", "3/4" (exact, so 0.1 + 0.2 style issues never arise)
    except (ValueError, ZeroDivisionError):
        pass
    try:
        value = float(s)  # "1e3", "12."
    except ValueError:
        return None
    return Fraction(value) if math.isfinite(value) else None


def answers_match(predicted: str, gold: str) -> bool:
    """Normalised exact match, with numeric equality for numbers ("12.0" == "12", "0.5" == "1/2")."""
    p, g = normalize_answer(predicted), normalize_answer(gold)
    if p == g:
        return True
    pn, gn = _as_number(p), _as_number(g)
    return pn is not None and gn is not None and pn == gn


def has_math_verify() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _math_verify_match(predicted: str, gold: str) -> bool | None:
    """math-verify's verdict, or None when it cannot parse one of the two (then the caller falls back).

    math-verify's timeouts use SIGALRM, which only works in the main thread; elsewhere they are off.
    """
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None

    def parsed(text: str):
        # as LaTeX first: the plain-expression parser reads "1+x" as 1
        candidates = (text,) if text.strip().startswith("$") else (f"${text}$", text)
        for candidate in candidates:
            result = parse(candidate, parsing_timeout=timeout)
            if result:
                return result
        return None

    try:
        g, p = parsed(gold), parsed(predicted)
        if not g or not p:
            return None
        return bool(verify(g, p, timeout_seconds=timeout))
    except Exception:  # math-verify raises on odd LaTeX; the plain comparison still gives an answer
        return None


# ---------------------------------------------------------------- built-in rewards


def row_value(sample: dict, key: str):
    """sample[key]; for a tunesmith Sample, whose unmapped columns sit in `extra` (a JSON text), looked up there."""
    if not isinstance(sample, dict):
        return None
    if sample.get(key) is not None:
        return sample[key]
    extra = sample.get("extra")
    if isinstance(extra, str) and extra:
        try:
            extra = json.loads(extra)
        except ValueError:
            return None
    return extra.get(key) if isinstance(extra, dict) else None


def _column(sample: dict, key: str, reward: str, index: int):
    value = row_value(sample, key)
    if value is None:
        keys = sorted(sample) if isinstance(sample, dict) else type(sample).__name__
        raise KeyError(f"reward '{reward}' needs a '{key}' column in each dataset row; row {index} has {keys}. "
                       f"Add the column to the data, or set `{'answer_key' if reward == 'accuracy' else 'box_key'}` "
                       f"in the reward's config entry")
    return value


def _check_lengths(prompts, responses, samples, reward: str) -> None:
    if not (len(prompts) == len(responses) == len(samples)):
        raise ValueError(f"reward '{reward}': got {len(prompts)} prompts, {len(responses)} responses and "
                         f"{len(samples)} samples; pass one prompt and one dataset row per response")


def accuracy(prompts: list[str], responses: list[str], samples: list[dict], *, answer_key: str = "answer",
             use_math_verify: bool | None = None, **kwargs) -> list[float]:
    """1.0 when the response's final answer (see extract_answer) equals the row's `answer`, else 0.0.

    Equality: normalised exact match or numeric equality (answers_match); if that fails and
    math-verify is installed (`pip install tunesmith[math]`; use_math_verify=None means "when
    installed"), math-verify decides, so "\\frac{1}{2}" matches "0.5" and "$x+1$" matches "1+x".
    """
    _check_lengths(prompts, responses, samples, "accuracy")
    verify = has_math_verify() if use_math_verify is None else use_math_verify
    rewards = []
    for i, (response, sample) in enumerate(zip(responses, samples)):
        gold = str(_column(sample, answer_key, "accuracy", i))
        predicted = extract_answer(response)
        ok = bool(predicted) and answers_match(predicted, gold)
        if not ok and verify and predicted:
            ok = bool(_math_verify_match(predicted, gold))
        rewards.append(1.0 if ok else 0.0)
    return rewards


DEFAULT_FORMAT_PATTERN = r"^<think>.*?</think>\s*<answer>.*?</answer>$"


def format_reward(prompts: list[str], responses: list[str], samples: list[dict], *,
                  pattern: str = DEFAULT_FORMAT_PATTERN, **kwargs) -> list[float]:
    """1.0 when `re.match(pattern, response.strip(), re.DOTALL)` matches, else 0.0.

    re.match anchors at the start only; end the pattern with `$` to demand a full match
    (the default does). Add inline flags such as (?i) to the pattern for more.
    """
    regex = re.compile(pattern, re.DOTALL)
    return [1.0 if regex.match(r.strip()) else 0.0 for r in responses]


def length_penalty(prompts: list[str], responses: list[str], samples: list[dict], *, max_len: int = 4096,
                   buffer: int = 1024, lengths: list[int] | None = None, **kwargs) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), in [−1, 0].

    With L = the response length, L_max = max_len and L_cache = buffer:
        0                              if L ≤ L_max − L_cache
        (L_max − L_cache − L)/L_cache  if L_max − L_cache < L ≤ L_max   (linear from 0 to −1)
        −1                             if L > L_max
    L is in tokens when the trainer passes `lengths` (one per response), else in characters
    of the response text; set max_len and buffer in the same unit.
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"length reward: buffer must be in (0, max_len], got buffer={buffer}, max_len={max_len}")
    sizes = list(lengths) if lengths is not None else [len(r) for r in responses]
    if len(sizes) != len(responses):
        raise ValueError(f"length reward: {len(sizes)} lengths for {len(responses)} responses")
    start = max_len - buffer
    return [0.0 if n <= start else -1.0 if n > max_len else (start - n) / buffer for n in sizes]


# Grounding: "[x1, y1, x2, y2]" / "(x1,y1,x2,y2)" boxes, "(x, y)" / "[x, y]" points, {"x": .., "y": ..}.
_NUM = r"-?\d+(?:\.\d+)?"
_BOX4 = re.compile(rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*[\])]")
_POINT2 = re.compile(rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*[\])]")
_XY = re.compile(rf"\"?x\"?\s*[:=]\s*({_NUM})\s*,\s*\"?y\"?\s*[:=]\s*({_NUM})", re.IGNORECASE)
_ANY_NUM = re.compile(rf"(?<![\w.]){_NUM}")


def parse_location(text: str) -> tuple[float, float] | tuple[float, float, float, float] | None:
    """The first point (x, y) or box (x1, y1, x2, y2) written in the text, None if there is none.

    Bracketed groups of 4 or 2 numbers (JSON lists such as {"bbox_2d": [10, 20, 50, 40]} or
    {"point": [12, 30]}, or plain "(12, 30)"), and x/y pairs ({"x": 12, "y": 30}, "x=12, y=30"),
    whichever comes first in the text. Without any of those, bare numbers: exactly four make a
    box, otherwise the first two a point.
    """
    found = []
    for regex in (_BOX4, _POINT2, _XY):
        m = regex.search(text)
        if m:
            found.append((m.start(), -len(m.groups()), tuple(float(v) for v in m.groups())))
    if found:
        return min(found)[2]  # earliest; at one position a box wins over a point
    numbers = [float(v) for v in _ANY_NUM.findall(text)]
    if len(numbers) == 4:
        return tuple(numbers)
    return tuple(numbers[:2]) if len(numbers) >= 2 else None


def box_iou(a, b) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes (continuous coordinates; corners in any order)."""
    ax1, ax2 = sorted((a[0], a[2]))
    ay1, ay2 = sorted((a[1], a[3]))
    bx1, bx2 = sorted((b[0], b[2]))
    by1, by2 = sorted((b[1], b[3]))
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def grounding(prompts: list[str], responses: list[str], samples: list[dict], *, box_key: str = "target_box",
              **kwargs) -> list[float]:
    """GUI grounding against the row's `target_box` [x1, y1, x2, y2] (same coordinates as the response).

    A predicted point (see parse_location) scores 1.0 inside the box (edges included), else
    0.0; a predicted box scores its IoU with the target; nothing parsable scores 0.0.
    """
    _check_lengths(prompts, responses, samples, "grounding")
    rewards = []
    for i, (response, sample) in enumerate(zip(responses, samples)):
        target = [float(v) for v in _column(sample, box_key, "grounding", i)]
        if len(target) != 4:
            raise ValueError(f"reward 'grounding': row {i}'s '{box_key}' must be [x1, y1, x2, y2], got {target}")
        loc = parse_location(response)
        if loc is None:
            rewards.append(0.0)
        elif len(loc) == 2:
            x1, x2 = sorted((target[0], target[2]))
            y1, y2 = sorted((target[1], target[3]))
            rewards.append(1.0 if x1 <= loc[0] <= x2 and y1 <= loc[1] <= y2 else 0.0)
        else:
            rewards.append(box_iou(loc, target))
    return rewards


# ---------------------------------------------------------------- reward model


class RewardModelReward:
    """Scores (prompt, response) with a reward model trained by `stage: rm`, then shapes the scores.

    The conversation is the row's `messages` (the prompt turns; a trailing assistant turn is
    dropped) when the row has them, else one user turn holding the prompt text; the response
    is the assistant turn after it. It is rendered with the reward model's own chat template,
    exactly as `tunesmith score` does, cut to `max_length` tokens, and the score is the head's
    output at the last token (methods.rm.sequence_rewards). The scores then go through a
    RewardShaper: + length_alpha·min(len/length_target, 1) with len the response length in
    tokens (the trainer's `lengths` when given, else counted with the reward model's
    tokenizer), running normalisation, clipping. The model loads on the first call, once.
    Under data parallelism gather the responses of all ranks before calling, so the running
    statistics agree (see RewardShaper).
    """

    def __init__(self, path: str, length_alpha: float = 0.0, length_target: int = 512, normalize: bool = False,
                 clip: float | None = None, batch_size: int = 8, max_length: int = 4096, device=None) -> None:
        from ..methods.reward_shaping import RewardShaper

        self.path = path
        self.shaper = RewardShaper(length_alpha=length_alpha, length_target=length_target, normalize=normalize,
                                   clip=clip)
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.model = None
        self.tokenizer = None

    def _load(self) -> None:
        if self.model is not None:
            return
        from ..infer.reward import load_reward_model
        from ..models.load import pick_device

        import torch

        device = torch.device(self.device) if self.device is not None else pick_device()
        self.model, self.tokenizer = load_reward_model(self.path, device)
        self.device = device

    def _conversation(self, prompt: str, response: str, sample: dict | None) -> list[dict]:
        messages = sample.get("messages") if isinstance(sample, dict) else None
        if messages:
            turns = [{"role": m["role"], "content": m["content"]} for m in messages]
            if turns[-1]["role"] == "assistant":
                turns = turns[:-1]
        else:
            turns = [{"role": "user", "content": prompt}]
        return turns + [{"role": "assistant", "content": response}]

    def score(self, prompts: list[str], responses: list[str], samples: list[dict] | None = None) -> list[float]:
        """Raw reward-model scores, before shaping."""
        import torch

        from ..data.collate import collate_rows
        from ..data.render import RenderOptions, render_sft
        from ..data.sample import make_sample
        from ..methods.rm import sequence_rewards

        self._load()
        samples = samples if samples is not None else [{}] * len(responses)
        opts = RenderOptions(cutoff_len=self.max_length)
        rows = [render_sft(make_sample(self._conversation(p, r, s), source="reward_model", index=i),
                           self.tokenizer, opts)
                for i, (p, r, s) in enumerate(zip(prompts, responses, samples))]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        scores: list[float] = []
        with torch.no_grad():
            for start in range(0, len(rows), self.batch_size):
                batch = collate_rows([[r] for r in rows[start : start + self.batch_size]], pad).to(self.device)
                scores += sequence_rewards(self.model, batch).tolist()
        return scores

    def __call__(self, prompts: list[str], responses: list[str], samples: list[dict], *,
                 lengths: list[int] | None = None, **kwargs) -> list[float]:
        import torch

        _check_lengths(prompts, responses, samples, "reward_model")
        if not responses:
            return []
        scores = self.score(prompts, responses, samples)
        if lengths is None:
            lengths = [len(self.tokenizer(r, add_special_tokens=False)["input_ids"]) for r in responses]
        shaped = self.shaper(torch.tensor(scores, dtype=torch.float32), torch.tensor(list(lengths)))
        return [float(v) for v in shaped.tolist()]

    def state_dict(self) -> dict[str, float]:
        return self.shaper.state_dict()

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.shaper.load_state_dict(state)


# ---------------------------------------------------------------- registry, user functions, combining

# A value that is a class is instantiated once per config entry with the entry's kwargs (it may hold
# a model or running statistics); a function receives the entry's kwargs at every call.
REWARDS: dict[str, RewardFn | type] = {
    "accuracy": accuracy,
    "format": format_reward,
    "length": length_penalty,
    "grounding": grounding,
    "reward_model": RewardModelReward,
}


def resolve_reward(spec: str) -> RewardFn:
    """Import `module.path:function` (the module must be importable, e.g. on PYTHONPATH) and return it."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward '{spec}': a user reward function is given as 'module.path:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward '{spec}': cannot import module '{module_name}' ({e}); make sure it is on "
                         f"PYTHONPATH (e.g. run from the folder that holds it)") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise ValueError(f"reward '{spec}': module '{module_name}' has no '{attr}'; its callables: {public}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"reward '{spec}': '{attr}' is a {type(obj).__name__}, not a function")
    return obj


@dataclass
class RewardSpec:
    """One config entry: a registered name or 'module:function', its weight and its kwargs."""

    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, item: "str | dict | RewardSpec") -> "RewardSpec":
        if isinstance(item, RewardSpec):
            return item
        if isinstance(item, str):
            return cls(item)
        if isinstance(item, dict):
            rest = dict(item)
            name = rest.pop("name", None)
            if not isinstance(name, str):
                raise ValueError(f"reward entry {item} needs a 'name' (one of {sorted(REWARDS)} or 'module:function')")
            weight = rest.pop("weight", 1.0)
            if not isinstance(weight, (int, float)) or isinstance(weight, bool):
                raise ValueError(f"reward '{name}': weight must be a number, got {weight!r}")
            return cls(name, float(weight), rest)
        raise ValueError(f"a reward entry is a name or {{\"name\": ..., \"weight\": ..., ...}}, got {item!r}")

    def build(self) -> RewardFn:
        if ":" in self.name:
            fn = resolve_reward(self.name)
        elif self.name in REWARDS:
            fn = REWARDS[self.name]
        else:
            raise ValueError(f"unknown reward '{self.name}'. Registered rewards: {', '.join(sorted(REWARDS))}; "
                             f"or give your own as 'module.path:function'")
        if isinstance(fn, type):
            return fn(**self.kwargs)
        return partial(fn, **self.kwargs) if self.kwargs else fn


class CombinedReward:
    """Σ weight·reward over the entries; calling returns (total, {name: that function's rewards})."""

    def __init__(self, specs: list[RewardSpec]) -> None:
        if not specs:
            raise ValueError(f"no reward function given; list at least one of {sorted(REWARDS)}")
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"reward(s) {dupes} listed twice; merge the entries (one name, one weight)")
        self.specs = specs
        self.functions = {s.name: s.build() for s in specs}
        self.weights = {s.name: s.weight for s in specs}

    def __call__(self, prompts: list[str], responses: list[str], samples: list[dict],
                 **kwargs) -> tuple[list[float], dict[str, list[float]]]:
        per_function: dict[str, list[float]] = {}
        total = [0.0] * len(responses)
        for name, fn in self.functions.items():
            values = fn(prompts, responses, samples, **kwargs)
            values = [float(v) for v in values]
            if len(values) != len(responses):
                raise ValueError(f"reward '{name}' returned {len(values)} values for {len(responses)} responses")
            per_function[name] = values
            weight = self.weights[name]
            total = [t + weight * v for t, v in zip(total, values)]
        return total, per_function

    def state_dict(self) -> dict[str, dict]:
        """Running statistics of the stateful rewards (reward-model normalisation), for checkpoints."""
        return {n: fn.state_dict() for n, fn in self.functions.items() if hasattr(fn, "state_dict")}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        for name, value in state.items():
            if name in self.functions and hasattr(self.functions[name], "load_state_dict"):
                self.functions[name].load_state_dict(value)


def combine(specs: list[RewardSpec]) -> CombinedReward:
    return CombinedReward([RewardSpec.parse(s) for s in specs])


def build_rewards(spec: list[dict | str] | str | dict) -> CombinedReward:
    """A config's reward list -> one callable (prompts, responses, samples, **kw) -> (total, per_function)."""
    items = spec if isinstance(spec, (list, tuple)) else [spec]
    return combine([RewardSpec.parse(item) for item in items])
