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
