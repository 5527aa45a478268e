"""Errors a request can cause, each with its HTTP status and OpenAI error type/code; the JSON body they become."""

from __future__ import annotations

from ..errors import TunesmithError


class RequestError(TunesmithError):
    """A request the server refuses; `param` names the offending field (OpenAI's error shape)."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, type: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code
        self.status = status or self.status
        self.type = type or self.type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


class ContextLengthError(RequestError):
    def __init__(self, max_model_len: int, num_prompt_tokens: int, max_tokens: int | None):
        asked = f"{num_prompt_tokens} in the prompt" + (f" + {max_tokens} for the answer (max_tokens)"
                                                        if max_tokens is not None else "")
        total = num_prompt_tokens + (max_tokens or 0)
        fix = ("shorten the prompt" if num_prompt_tokens >= max_model_len else
               f"lower max_tokens to at most {max_model_len - num_prompt_tokens}, or shorten the prompt")
        super().__init__(f"This model's context is {max_model_len} tokens; the request needs {total} ({asked}): "
                         f"{fix}.", param="max_tokens" if max_tokens is not None else "messages",
                         code="context_length_exceeded")


class UnknownModelError(RequestError):
    status = 404

    def __init__(self, name: str, known: list[str]):
        super().__init__(f"The model '{name}' is not served here; this server serves: {', '.join(known)} "
                         "(GET /v1/models lists them).", param="model", code="model_not_found")


class BusyError(RequestError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, waiting: int, max_concurrent: int):
        super().__init__(f"The server is busy: {max_concurrent} requests are generating and {waiting} are waiting "
                         "(max_queue); retry later.", code="server_busy")


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
