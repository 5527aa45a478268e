"""What one generation asks for, backend-neutral: sampling settings, the answer's length, stop strings."""

from __future__ import annotations

from dataclasses import dataclass

from ..infer.options import GenerationKeys


@dataclass(frozen=True)
class Sampling:
    """The YAML's generation keys with one request's values over them, plus what only a request sets.

    max_tokens: the answer's length asked for explicitly (a refusal when the prompt leaves less room);
        None: generation.max_new_tokens, cut to the room the context leaves.
    stop: strings that end the answer; the answer stops before the first one.
    presence_penalty / frequency_penalty: OpenAI's, subtracted from the logits of tokens already generated
        (once / per occurrence).
    seed: seeds the sampler for this request (repeatable when requests do not overlap: the HF backend
        has one random generator per process).
    """

    generation: GenerationKeys = GenerationKeys()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    @classmethod
    def of(cls, generation: GenerationKeys) -> "Sampling":
        """The YAML's settings alone (chat): an explicit max_new_tokens counts as asked for."""
        explicit = "max_new_tokens" in generation.model_fields_set
        return cls(generation, generation.max_new_tokens if explicit else None)

    def with_request(self, *, temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                     repetition_penalty: float | None = None, max_tokens: int | None = None,
                     stop: tuple[str, ...] = (), presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                     seed: int | None = None) -> "Sampling":
        """The request's values over the YAML's; a request's temperature decides greedy (0) or sampling (> 0)."""
        update = {k: v for k, v in {"temperature": temperature, "top_p": top_p, "top_k": top_k,
                                     "repetition_penalty": repetition_penalty}.items() if v is not None}
        if temperature is not None:
            update["do_sample"] = None  # the request's temperature decides, not the YAML's do_sample
        return Sampling(self.generation.model_copy(update=update), max_tokens if max_tokens is not None
                        else self.max_tokens, tuple(stop), presence_penalty, frequency_penalty, seed)

    def answer_budget(self, num_prompt_tokens: int, max_model_len: int | None) -> int:
        """Tokens the answer may take; ContextLengthError when the prompt and the asked-for answer do not fit."""
        from .errors import ContextLengthError

        wanted = self.max_tokens if self.max_tokens is not None else self.generation.max_new_tokens
        if max_model_len is None:
            return wanted
        room = max_model_len - num_prompt_tokens
        if room < 1 or (self.max_tokens is not None and self.max_tokens > room):
            raise ContextLengthError(max_model_len, num_prompt_tokens, self.max_tokens)
        return min(wanted, room)


class StopCutter:
    """Cuts streamed text before the first stop string, holding back a tail that may be a stop's beginning.

    feed() returns the text that is safe to show now; once a stop is seen, `hit` is set and the rest is
    dropped. flush() returns what was held back when the answer ends without a stop.
    """

    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(s for s in stops if s)
        self.held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        text = self.held + text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit, self.held = True, ""
            return text[:cut]
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep] if keep else text

    def flush(self) -> str:
        held, self.held = self.held, ""
        return "" if self.hit else held
