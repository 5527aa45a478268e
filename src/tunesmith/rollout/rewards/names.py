"""The names of the built-in rewards, for config validation (config/ reads this without loading the rewards;
registry.REWARDS maps each name to its function, and a test keeps the two equal)."""

BUILTIN_REWARDS = ("accuracy", "format", "length", "grounding", "reward_model")
