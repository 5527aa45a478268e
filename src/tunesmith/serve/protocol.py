"""The OpenAI request bodies this server takes, validated with pydantic.

Unknown fields are refused (as OpenAI does), and so are fields whose feature the server does not
have (logprobs, constrained tool choice, JSON-schema output), each saying what to send instead.
`top_k`, `repetition_penalty` and `chat_template_kwargs` are vLLM's extensions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageURL(_Body):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCallIn(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(_Body):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Body):
    include_usage: bool = False


def _unsupported(value, fix: str):
    if value not in (None, False, 0, [], {}):
        raise ValueError(fix)
    return value


class _Generation(_Body):
    """Fields the chat and completion endpoints share."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    repetition_penalty: float | None = Field(None, gt=0)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=8)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and not used (OpenAI uses it for abuse monitoring)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 16 or any(not s for s in stops):
            raise ValueError("give at most 16 non-empty stop strings")
        return stops

    @field_validator("logprobs", "top_logprobs", check_fields=False)  # declared by the endpoints' own models
    @classmethod
    def _no_logprobs(cls, value):
        return _unsupported(value, "log probabilities are not returned by this server; leave logprobs out")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value):
        return 0 if value in (-1, 0) else value  # vLLM's "all tokens": off (None would take the YAML's top_k)

    def stops(self) -> tuple[str, ...]:
        return tuple(self.stop or ())


class ChatCompletionRequest(_Generation):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        if value not in (None, "none", "auto"):
            raise ValueError("forcing a tool call needs constrained decoding, which this server does not have; "
                             "use tool_choice 'auto' (the model decides) or 'none'")
        return value

    @field_validator("response_format")
    @classmethod
    def _format(cls, value):
        if value and value.get("type") not in (None, "text"):
            raise ValueError("structured output (json_object / json_schema) needs constrained decoding, which "
                             "this server does not have; ask for JSON in the prompt and leave response_format out")
        return value

    def answer_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Generation):
    prompt: str | list[str] = Field(min_length=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value):
        return _unsupported(value, "insertion (suffix) is not supported; send the prompt only")

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value):
        if value not in (None, 1):
            raise ValueError("best_of is not supported; use n for several answers")
        return value

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def answer_tokens(self) -> int | None:
        return self.max_tokens
