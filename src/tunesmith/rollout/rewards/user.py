"""Users' own reward functions: `module.path:function` or `path/to/file.py:function`, in any of three
signatures, each run like a built-in reward (tunesmith's signature) with errors that name the file and function.

* tunesmith's: fn(prompts, responses, samples, **kwargs) -> list[float] (see rewards/__init__.py);
* TRL's: reward_func(prompts, completions, **columns) -> list[float]: `prompts` and `completions` are the
  rendered prompt texts and the response texts, and every column of the dataset rows comes as a keyword with
  one value per response (None where a row lacks it), with the reward's config keys;
* verl's: compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float (or a dict with
  "score"), called once per response; ground_truth is the row's `reward_model.ground_truth` (verl's parquet
  files), else its `ground_truth` or `answer` column.

The signature is told from the parameter names: `solution_str` and `ground_truth` are verl's, `completions`
is TRL's, anything else tunesmith's.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from ...errors import TunesmithError
from .rows import row_value


class RewardError(TunesmithError, ValueError):
    """A user's reward function could not be loaded, raised, or returned the wrong thing."""


def resolve_reward(spec: str):
    """The function named by `module.path:function` (the module importable, e.g. on PYTHONPATH) or
    `path/to/file.py:function` (a file, relative to the working directory)."""
    source, sep, attr = spec.rpartition(":")
    if not sep or not source or not attr:
        raise RewardError(f"reward '{spec}': a user reward function is given as 'module.path:function' or "
                          "'path/to/file.py:function'")
    module = _load_file(spec, source) if source.endswith(".py") else _import(spec, source)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise RewardError(f"reward '{spec}': {_where(source)} has no '{attr}'; its callables: {public}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardError(f"reward '{spec}': '{attr}' is a {type(obj).__name__}, not a function")
    return obj


def _where(source: str) -> str:
    return f"file {source}" if source.endswith(".py") else f"module '{source}'"


def _import(spec: str, module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise RewardError(f"reward '{spec}': cannot import module '{module_name}' ({e}); make sure it is on "
                          "PYTHONPATH (e.g. run from the folder that holds it), or name the file: "
                          "path/to/file.py:function") from e


def _load_file(spec: str, file_name: str):
    path = Path(file_name).expanduser().resolve()
    if not path.is_file():
        raise RewardError(f"reward '{spec}': no file {file_name} (looked for {path}; a relative path is "
                          "relative to the working directory)")
    # One module per file (its path in the name), so two files that share a name do not collide.
    name = f"tunesmith_user_reward_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise RewardError(f"reward '{spec}': loading {file_name} raised {type(e).__name__}: {e}") from e
    sys.modules[name] = module
    return module


def call_style(fn) -> str:
    """'verl', 'trl' or 'tunesmith', from the function's parameter names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: tunesmith's signature
        return "tunesmith"
    if "solution_str" in params and "ground_truth" in params:
        return "verl"
    if "completions" in params:
        return "trl"
    return "tunesmith"


class UserReward:
    """A user's function in tunesmith's reward signature: adapts TRL's and verl's, and turns what goes wrong
    into an error naming the reward (file or module, and function)."""

    def __init__(self, spec: str, **kwargs):
        self.spec, self.kwargs = spec, kwargs
        self.fn = resolve_reward(spec)
        if isinstance(self.fn, type):  # a reward with state: one instance per config entry, built with its keys
            self.fn, self.kwargs = self.fn(**kwargs), {}
        self.style = call_style(self.fn)

    def __getattr__(self, name):
        if name in ("state_dict", "load_state_dict"):  # a stateful reward's statistics go into checkpoints
            return getattr(self.__dict__["fn"], name)
        raise AttributeError(name)

    def __call__(self, prompts: list[str], responses: list[str], samples: list[dict], **trainer) -> list[float]:
        try:
            if self.style == "verl":
                values = [self._verl_one(r, s) for r, s in zip(responses, samples)]
            elif self.style == "trl":
                values = self.fn(prompts=prompts, completions=responses, **_columns(samples), **self.kwargs)
            else:
                values = self.fn(prompts, responses, samples, **trainer, **self.kwargs)
        except RewardError:
            raise
        except Exception as e:
            raise RewardError(f"reward '{self.spec}' ({self.style} signature) raised {type(e).__name__}: {e}") from e
        return self._checked(values, len(responses))

    def _verl_one(self, response: str, sample: dict):
        truth = row_value(sample, "reward_model")
        truth = truth.get("ground_truth") if isinstance(truth, dict) else None
        if truth is None:
            truth = row_value(sample, "ground_truth")
        if truth is None:
            truth = row_value(sample, "answer")
        score = self.fn(data_source=row_value(sample, "data_source"), solution_str=response, ground_truth=truth,
                        extra_info=row_value(sample, "extra_info"), **self.kwargs)
        return score["score"] if isinstance(score, dict) and "score" in score else score

    def _checked(self, values, expected: int) -> list[float]:
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise RewardError(f"reward '{self.spec}' returned a {type(values).__name__}; it must return a list "
                              f"with one float per response ({expected})")
        if len(values) != expected:
            raise RewardError(f"reward '{self.spec}' returned {len(values)} values for {expected} responses; it "
                              "must return one float per response")
        out = []
        for i, value in enumerate(values):
            try:
                out.append(float(value))
            except (TypeError, ValueError):
                raise RewardError(f"reward '{self.spec}' returned {value!r} for response {i}; every value must "
                                  "be a number") from None
        return out


def _columns(samples: list[dict]) -> dict[str, list]:
    """Every column of the rows (top-level, and a Sample's `extra` JSON), one value per response."""
    import json

    names: list[str] = []
    for sample in samples:
        keys = list(sample) if isinstance(sample, dict) else []
        extra = sample.get("extra") if isinstance(sample, dict) else None
        if isinstance(extra, str) and extra:
            try:
                keys += list(json.loads(extra))
            except ValueError:
                pass
        names += [k for k in keys if k not in names and k != "extra"]
    reserved = {"prompts", "completions"}
    return {name: [row_value(s, name) for s in samples] for name in names if name not in reserved}
