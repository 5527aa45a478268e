"""`reward_model`: a reward model trained with `stage: rm`, its scores shaped by a RewardShaper."""

from __future__ import annotations

from .rows import check_lengths


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
        from ...methods.reward_shaping import RewardShaper

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
        from ...infer.reward import load_reward_model
        from ...models.load import pick_device

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

        from ...data.collate import collate_rows
        from ...data.render import RenderOptions, render_sft
        from ...data.sample import make_sample
        from ...models.forward import sequence_rewards

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

        check_lengths(prompts, responses, samples, "reward_model")
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
