"""Steps of online RL (stage grpo and its presets).

Per step: take `prompts_per_step` prompts -> generate `num_generations` responses each
-> score them with the reward functions -> group advantages (DAPO dynamic sampling
drops all-equal groups and draws more prompts) -> `ppo_epochs` x `num_mini_batches`
updates, which the Runner runs. Old and reference log-probs are computed once per
rollout batch, before any update (strictly on-policy, 1 x 1, needs no old ones).
Generation goes through the RolloutEngine interface only (rollout/engine.py): an engine with its own copy of
the weights gets the trainer's full weights before each rollout and sleeps during the updates; the log-probs
it sampled with travel with each micro-batch as `sampler_logps_BT`, for the gap metrics and its correction.
"""

from __future__ import annotations

import copy
import math
import time

import torch

from .. import dist
from ..data.collate import collate_rows
from ..data.mm import media_plans
from ..data.render import IGNORE_INDEX
from ..errors import ConfigError, TunesmithError
from ..methods.advantages import ADVANTAGES, clip_advantages, zero_variance_groups
from ..methods.base import PrePass
from ..models.families import collation_pad_id
from ..rollout.backends import build_rollout
from ..rollout.engine import Rollouts, Sampling
from ..rollout.rewards import build_rewards
from .plan import shuffled
from .steps import Step, run_prepasses


def media_token_ids(tokenizer, media) -> list[int]:
    """A vision/audio-language model's media placeholder and marker tokens. A sampled response must never hold
    one: the training forward would read it as a media item without pixels (and fail, or mis-place mRoPE)."""
    if media is None:
        return []
    ids = set(media.token_ids.values())
    for text in media.markers.values():
        ids.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return sorted(ids)


class RolloutSteps:
    eval_before_training = True
    progress_key = "reward_mean"

    def __init__(self, cfg, prompts: list[dict], eval_prompts: list[dict], method, tokenizer, media, stop_ids):
        self.cfg, self.rl, self.method = cfg, cfg.rl, method
        self.prompts, self.eval_prompts = prompts, eval_prompts
        self.tokenizer, self.media = tokenizer, media
        if self.rl.prompts_per_step % dist.world():
            raise TunesmithError(f"prompts_per_step={self.rl.prompts_per_step} must be a multiple of the "
                                 f"{dist.world()} processes (each takes whole prompt groups)")
        if self.rl.prompts_per_step > len(prompts) and cfg.train.do_train:
            raise ConfigError([f"prompts_per_step={self.rl.prompts_per_step} is more than the {len(prompts)} training "
                               "prompts: every step would repeat prompts and an epoch would pass in a fraction of a "
                               f"step. Set prompts_per_step to at most {len(prompts)} (num_generations sets the "
                               "responses per prompt), or add prompts (max_samples, val_size and a dataset's "
                               "num_samples set how many are used)"])
        self.steps_per_epoch = math.ceil(len(prompts) / self.rl.prompts_per_step)
        self.sampling = Sampling(self.rl.max_new_tokens, self.rl.temperature, self.rl.top_p, self.rl.top_k,
                                 stop_ids=tuple(stop_ids), pad_id=tokenizer.pad_token_id,
                                 suppress_ids=tuple(media_token_ids(tokenizer, media)))
        self.rollout = None  # built by prepare(), once the engine holds the model
        self.rewards = build_rewards([f.model_dump() for f in self.rl.reward_funcs])
        self.position = {"prompt_epoch": 0, "prompt_index": 0}

    def prepare(self, engine) -> None:
        if self.rollout is None:
            self.rollout = build_rollout(self.rl.rollout_backend, engine.model, media=self.media is not None,
                                         world_size=dist.world(), vllm_args=lambda: self._vllm_args(engine))

    def _vllm_args(self, engine) -> dict:
        """vLLM's engine settings: the model folder, dtype, and its share of the GPU (what the trainer's states
        leave, from the memory estimate, unless rollout_gpu_memory_utilization is set)."""
        from ..estimate import estimate_memory
        from ..quiet import held_back
        from ..rollout.vllm import memory_fraction

        share = self.rl.rollout_gpu_memory_utilization
        if share is None:
            with held_back():  # the estimate's dry run of the fine-tuning settings: the model has said its notes
                est = estimate_memory(self.cfg, num_gpus=dist.world())
            states = est["weights"] + est["gradients"] + est["optimizer"] + est["gathered_params"] + est["overhead"]
            share = memory_fraction(states, est["gpu_gib"])
        m = self.cfg.model
        dtype = "bfloat16" if m.bf16 or m.pure_bf16 else "float16" if m.fp16 else "float32"
        width = max(len(p["ids"]) for p in self.prompts + self.eval_prompts) + self.rl.max_new_tokens
        num_seqs = max(self.rl.prompts_per_step * self.rl.num_generations, self.rl.eval_num_prompts)
        return {"model_path": engine.model.config.name_or_path, "dtype": dtype, "gpu_memory_utilization": share,
                "max_model_len": width, "seed": self.cfg.train.seed, "num_seqs": num_seqs,
                "fp32_logits": self.rl.cast_lm_head_to_fp32}

    # ---- prompts --------------------------------------------------------------------------------
    def _order(self, epoch: int) -> list[int]:
        return shuffled(len(self.prompts), self.cfg.train.seed, epoch, not self.cfg.train.disable_shuffling)

    def _next_prompts(self, count: int) -> list[dict]:
        """The next `count` prompts of the shared order; each rank keeps its own share (whole groups)."""
        picked, pos = [], self.position
        while len(picked) < count:
            order = self._order(pos["prompt_epoch"])
            take = order[pos["prompt_index"] : pos["prompt_index"] + count - len(picked)]
            picked += [self.prompts[i] for i in take]
            pos["prompt_index"] += len(take)
            if pos["prompt_index"] >= len(order):
                pos.update(prompt_epoch=pos["prompt_epoch"] + 1, prompt_index=0)
        return picked[dist.rank() :: dist.world()]

    # ---- rollouts -------------------------------------------------------------------------------
    def _generation_media(self, prompts: list[dict], rollout, device) -> dict | None:
        """The prompts' media for generate(), decoded once per rollout: their images for an engine that runs the
        processor itself (`raw_media`), else the processed inputs and the token types; None for text prompts."""
        if self.media is None or not any(p["mm_plan"] for p in prompts):
            return None
        plans = media_plans(prompts)
        if rollout.raw_media:
            return {"images": self.media.images_of(plans)}
        inputs, _ = self.media.process(plans)
        # every tensor the processing gave; the rollout engine keeps those its model's forward takes
        media = {k: v.to(device) for k, v in inputs.items() if torch.is_tensor(v)}
        return {**media, "token_types": self.media.token_ids} if media else media

    def _generate(self, engine, prompts: list[dict], greedy: bool, n: int) -> Rollouts:
        self.prepare(engine)
        rollout = self.rollout
        if not rollout.shares_weights:  # its own copy: the trainer's weights of now, then generate
            rollout.wake()
            rollout.update_weights(rollout_weights(engine))
        media = self._generation_media(prompts, rollout, engine.device)
        sampling = self.sampling.greedy_copy() if greedy else self.sampling
        try:
            return rollout.generate([p["ids"] for p in prompts], sampling, n, media=media)
        finally:
            if not rollout.shares_weights:
                rollout.sleep()  # the updates get the memory

    def _rollout(self, engine, prompts: list[dict], greedy: bool = False, generations: int | None = None):
        g = generations or self.rl.num_generations
        out = self._generate(engine, prompts, greedy, g)
        responses = out.responses
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        expanded = [p for p in prompts for _ in range(g)]
        total, per_fn = self.rewards([p["text"] for p in expanded], texts, [p["sample"] for p in expanded],
                                     lengths=[len(r) for r in responses])
        return expanded, responses, out.logps, torch.tensor(total), per_fn

    def _collect(self, engine, timing: dict):
        """Rollouts for one step; with dynamic sampling, groups whose rewards are all equal are replaced."""
        rl, kept, rounds, zero_share = self.rl, None, 0, 0.0
        while True:
            t0 = time.perf_counter()
            prompts, responses, logps, rewards, per_fn = self._rollout(engine, self._next_prompts(rl.prompts_per_step))
            timing["generate"] += time.perf_counter() - t0
            groups = torch.arange(len(prompts)) // rl.num_generations
            flat = zero_variance_groups(rewards, groups)
            zero_share = zero_share or float(flat.float().mean())
            part = (prompts, responses, logps, rewards, groups, per_fn)
            if rl.dynamic_sampling:
                keep = (~flat).nonzero().squeeze(-1).tolist()
                part = ([prompts[i] for i in keep], [responses[i] for i in keep], [logps[i] for i in keep],
                        rewards[keep], groups[keep] + 10**6 * rounds,
                        {k: [v[i] for i in keep] for k, v in per_fn.items()})
            kept = part if kept is None else _concat(kept, part)
            rounds += 1
            short = len(kept[0]) < rl.prompts_per_step * rl.num_generations // dist.world()
            if not rl.dynamic_sampling or dist.sum_int(int(short)) == 0 or rounds > rl.max_resample_rounds:
                break  # every rank decides the same way: each draw is a collective generate
        if dist.sum_int(int(not kept[0])):
            raise TunesmithError("dynamic_sampling: every group had equal rewards in every draw; "
                                 "raise max_resample_rounds or check the reward functions")
        return (*kept, zero_share)

    def _micro_batches(self, prompts, responses, logps, device) -> list:
        rows = [[{"input_ids": p["ids"] + r, "labels": [IGNORE_INDEX] * len(p["ids"]) + r, "mm_plan": p["mm_plan"]}]
                for p, r in zip(prompts, responses)]
        size = self.cfg.train.per_device_train_batch_size
        batches = []
        for i in range(0, len(rows), size):
            pad_id = collation_pad_id(self.tokenizer, self.media.family if self.media else None)
            batch = collate_rows(rows[i : i + size], pad_id, media=self.media).to(device)
            batch.extra["sampler_logps_BT"] = sampler_logps_like(batch.targets_BT, logps[i : i + size])
            batches.append(batch)
        return batches

    def _kl_in_reward(self, engine, batches, rewards: torch.Tensor) -> torch.Tensor:
        if not (self.rl.kl_coef and self.rl.kl_in_reward):
            return rewards
        if self.method.on_policy:  # no old log-probs to reuse: the current policy's, once
            run_prepasses(engine, _PolicyLogps(self.method), batches)
        return rewards - self.rl.kl_coef * torch.cat([self.method.sequence_kl(b) for b in batches])

    def next_step(self, engine) -> Step:
        timing = {"generate": 0.0}
        epoch_before = self.position["prompt_epoch"]
        t0 = time.perf_counter()
        prompts, responses, logps, rewards, groups, per_fn, zero_share = self._collect(engine, timing)
        t1 = time.perf_counter()
        batches = self._micro_batches(prompts, responses, logps, engine.device)
        run_prepasses(engine, self.method, batches)  # old and reference log-probs, before any update
        rewards = self._kl_in_reward(engine, batches, rewards)
        advantages = clip_advantages(ADVANTAGES[self.rl.advantage](rewards, groups), self.rl.advantage_clip)
        size = self.cfg.train.per_device_train_batch_size
        for i, batch in enumerate(batches):
            batch.extra["advantages_B"] = advantages[i * size : (i + 1) * size].to(engine.device)
        timing.update(score=t1 - t0 - timing["generate"], prepare=time.perf_counter() - t1)
        tokens = sum(len(p["ids"]) + len(r) for p, r in zip(prompts, responses))
        metrics = self._metrics(responses, rewards, advantages, per_fn, zero_share, timing)
        return Step(self._updates(batches), tokens, epoch_ended=self.position["prompt_epoch"] > epoch_before,
                    metrics=metrics, train_tokens=tokens * self.rl.ppo_epochs)

    def _updates(self, batches) -> list[list]:
        """ppo_epochs passes over num_mini_batches mini-batches, each one optimiser step."""
        batches = _pad_to_same_count(batches)
        per_mini = math.ceil(len(batches) / self.rl.num_mini_batches)
        minis = [batches[i : i + per_mini] for i in range(0, len(batches), per_mini)]
        return [mini for _ in range(self.rl.ppo_epochs) for mini in minis]

    def _metrics(self, responses, rewards, advantages, per_fn, zero_share, timing) -> dict:
        responses, rewards, advantages, per_fn = _gathered(responses, rewards, advantages, per_fn)
        lengths = torch.tensor([len(r) for r in responses], dtype=torch.float32)
        metrics = {"reward_mean": float(rewards.mean()),
                   "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
                   "advantage_mean": float(advantages.mean()), "advantage_std": float(advantages.std()),
                   "response_length_mean": float(lengths.mean()), "response_length_max": float(lengths.max()),
                   "zero_variance_group_share": zero_share,
                   "generate_tokens_per_s": float(lengths.sum()) / max(timing["generate"], 1e-9),
                   **{f"time_{k}": v for k, v in timing.items()}}
        metrics.update({f"reward_{name}": sum(v) / len(v) for name, v in per_fn.items()})
        return metrics

    @property
    def eval_samples(self) -> int:
        return min(len(self.eval_prompts), self.rl.eval_num_prompts)

    @torch.no_grad()
    def evaluate(self, engine) -> dict:
        """Greedy answers on the held-out prompts: the mean of each reward function."""
        prompts = self.eval_prompts[: self.rl.eval_num_prompts][dist.rank() :: dist.world()]
        if not prompts:
            return {}
        responses, _, _, rewards, per_fn = self._rollout(engine, prompts, greedy=True, generations=1)
        _, rewards, _, per_fn = _gathered(responses, rewards, rewards, per_fn)
        out = {"eval_reward_mean": float(rewards.mean())}
        out.update({f"eval_reward_{k}": sum(v) / len(v) for k, v in per_fn.items()})
        return out

    def state_dict(self) -> dict:
        return {**self.position, "rewards": self.rewards.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self.rewards.load_state_dict(state.pop("rewards", {}))
        self.position = {"prompt_epoch": state["prompt_epoch"], "prompt_index": state["prompt_index"]}


class _PolicyLogps:
    """The current policy's token log-probs as a pre-pass (kl_in_reward when strictly on-policy)."""

    def __init__(self, method):
        self._passes = [PrePass("policy_logps_BT", "logits", method.token_logps)]

    def prepasses(self) -> list[PrePass]:
        return self._passes


def _gathered(responses, rewards, advantages, per_fn):
    """Every rank's rollouts, for metrics over the whole step."""
    if dist.world() == 1:
        return responses, rewards, advantages, per_fn
    import torch.distributed as tdist

    parts = [None] * dist.world()
    tdist.all_gather_object(parts, (responses, rewards.tolist(), advantages.tolist(), per_fn))
    names = parts[0][3].keys()
    return ([r for p in parts for r in p[0]], torch.tensor([x for p in parts for x in p[1]]),
            torch.tensor([x for p in parts for x in p[2]]), {k: [x for p in parts for x in p[3][k]] for k in names})


def _pad_to_same_count(batches: list) -> list:
    """Ranks must run the same number of forward/backward passes (sharded collectives): a rank with fewer
    micro-batches (dynamic sampling) adds copies whose every target is masked (no loss, no units)."""
    most = dist.max_int(len(batches))
    padded = list(batches)
    while len(padded) < most:
        dummy = copy.copy(batches[-1])
        dummy.targets_BT = torch.full_like(batches[-1].targets_BT, IGNORE_INDEX)
        dummy.counted_rows = None  # found again from the new targets
        dummy.num_label_tokens, dummy.num_samples, dummy.num_tokens = 0, 0, 0
        dummy.extra = dict(batches[-1].extra)
        padded.append(dummy)
    return padded


def _concat(a: tuple, b: tuple) -> tuple:
    per_fn = {k: a[5][k] + b[5][k] for k in a[5]}
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], torch.cat([a[3], b[3]]), torch.cat([a[4], b[4]]), per_fn)


def sampler_logps_like(targets_BT: torch.Tensor, logps: list[list[float]]) -> torch.Tensor:
    """The sampler's log-probs laid out like the targets: response token j of row b at the j-th supervised
    position of that row (the response tokens are a row's only targets, in order), 0 elsewhere."""
    out = torch.zeros(targets_BT.shape, dtype=torch.float32)
    valid = (targets_BT != IGNORE_INDEX).cpu()
    for b, row in enumerate(logps):
        positions = valid[b].nonzero().squeeze(-1)
        if len(positions) != len(row):
            raise TunesmithError(f"rollout: response {b} has {len(positions)} training targets but {len(row)} "
                                 "sampler log-probs")
        out[b, positions] = torch.tensor(row, dtype=torch.float32)
    return out.to(targets_BT.device)


def rollout_weights(engine):
    """(name, tensor) pairs of the trainer's full weights in Hugging Face names, LoRA merged in, for a rollout
    engine with its own copy (vLLM loads base-model names; an adapter's A/B matrices it would not know)."""
    model = engine.model
    merges = (hasattr(model, "merge_adapter") and hasattr(model, "peft_config")
              and not getattr(engine, "merges_lora_for_rollout", False))
    if merges:
        model.merge_adapter()
    try:
        state = engine.full_state_for_rollout()
        for name, tensor in state.items():
            if "lora_" not in name and ".original_module." not in name:  # merged in / replaced by the trained copy
                # A merged layer's tensor is the live parameter, which unmerge_adapter() below changes back in
                # place: a copy, or the engine (which may load after this generator ends) would get the base.
                yield hf_weight_name(name), tensor.clone() if merges and ".base_layer." in name else tensor
    finally:
        if merges:
            model.unmerge_adapter()


def hf_weight_name(name: str) -> str:
    """A PEFT-wrapped parameter's name as in the base model's own checkpoint."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
