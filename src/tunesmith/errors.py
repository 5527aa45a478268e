"""Errors a user can cause. Each message names the bad value and the fix."""


class TunesmithError(Exception):
    """Base class: the CLI prints these without a stack trace."""


class ConfigError(TunesmithError):
    """A bad key or value in the run configuration."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the configuration:\n{lines}")


class DataError(TunesmithError):
    """A bad dataset, file or record. The message names the file/record and the fix."""


class ModelError(TunesmithError):
    """A model, tokenizer or template that cannot be loaded or used."""


def raised_at(err: BaseException) -> str:
    """ " (at file:line)" of the innermost frame `err` was raised in, for a message that is not a stack trace; "" when
    it carries none."""
    import traceback

    if err.__traceback__ is None:
        return ""
    frame = traceback.extract_tb(err.__traceback__)[-1]
    return f" (at {frame.filename}:{frame.lineno})"
