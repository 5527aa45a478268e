"""The online-RL loop (stage grpo and its presets).

Per step: take `prompts_per_step` prompts -> generate `num_generations` responses each
-> score them with the reward functions -> group advantages (DAPO dynamic sampling
drops all-equal groups and draws more prompts) -> `ppo_epochs` x `num_mini_batches`
optimiser steps -> log -> evaluate -> checkpoint. Strictly on-policy (1 x 1): the old
log-probs are the detached current ones, no extra forward. Otherwise they are
computed once after generation.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time

import torch

from .. import dist
from ..data.collate import collate_rows
from ..data.mm import check_placeholders, expand_media_tokens, has_media, media_plans, to_content_parts
from ..data.pipeline import identity_placeholders, render_options
from ..data.render import IGNORE_INDEX, render_text
from ..data.sample import where
from ..errors import DataError, TunesmithError
from ..methods.advantages import ADVANTAGES, clip_advantages, zero_variance_groups
from ..methods.grpo import PRESETS, GRPOMethod, response_logps
from ..methods.policy_losses import kl_penalty
from ..methods.preference import Reference
from ..rollout.engine import HFRollout
from ..rollout.rewards import build_rewards
from . import checkpoint as ckpt

log = logging.getLogger("tunesmith")


def _no_copy_under_fsdp(cfg, engine) -> bool:
    if dist.world() > 1 and cfg.rl.kl_coef and not hasattr(engine.model, "disable_adapter"):
        raise TunesmithError("a KL penalty to a frozen copy is not available on several processes yet; use "
                             "finetuning_type: lora (the reference is the base with adapters off) or kl_coef: 0")
    return False


def apply_preset(cfg) -> None:
    """A named stage (dr_grpo, dapo, gspo, ...) sets its algorithm's settings unless the config set them."""
    given = cfg.rl.model_fields_set
    for key, value in PRESETS[cfg.finetune.stage].items():
        if key not in given:
            setattr(cfg.rl, key, value)


def prepare_prompts(cfg, tokenizer, names: list[str], media=None) -> list[dict]:
    """Prompt token ids (chat template with the generation prompt) and each sample's columns for the rewards.

    Media prompts (vision-language models) are planned from their headers, as for SFT: the media tokens are
    expanded to what the processor would produce, and the plan travels with the prompt."""
    from ..data.loader import load_samples

    samples, _ = load_samples(names, dataset_dir=cfg.data.dataset_dir, stage=cfg.finetune.stage,
                              max_samples=cfg.data.max_samples, seed=cfg.train.seed,
                              skip_bad_samples=cfg.data.skip_bad_samples,
                              placeholders=identity_placeholders(cfg))
    opts = render_options(cfg, tokenizer)
    prompts = []
    for sample in samples:
        messages = sample["messages"]
        extra = json.loads(sample.get("extra") or "{}")
        if messages and messages[-1]["role"] == "assistant":  # an SFT-style record: its answer is the reference
            extra.setdefault("answer", messages[-1]["content"])
            messages = messages[:-1]
        prompt = _prompt_ids(sample, messages, tokenizer, opts, media)
        if len(prompt["ids"]) > cfg.data.cutoff_len:
            raise DataError(f"{where(sample)}: the prompt has {len(prompt['ids'])} tokens, more than "
                            f"cutoff_len={cfg.data.cutoff_len}; raise cutoff_len")
        prompts.append({**prompt, "sample": {**extra, "messages": messages}})
    return prompts


def _prompt_ids(sample: dict, messages: list[dict], tokenizer, opts, media) -> dict:
    has = has_media(sample)
    if has and media is None:
        raise DataError(f"{where(sample)} has media but the model is a text-only model")
    text = render_text(tokenizer, to_content_parts(messages) if has else messages, opts, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not has:
        return {"ids": ids, "text": text, "mm_plan": ""}
    check_placeholders({**sample, "messages": messages})
    expansions, plan = media.plan(sample)
    ids, _ = expand_media_tokens(ids, list(ids), expansions, IGNORE_INDEX)
    return {"ids": ids, "text": text, "mm_plan": plan}


def _media_token_ids(tokenizer, media) -> list[int]:
    """A vision/audio-language model's media placeholder and marker tokens. A sampled response must never hold
    one: the training forward would read it as a media item without pixels (and fail, or mis-place mRoPE)."""
    if media is None:
        return []
    ids = set(media.token_ids.values())
    for text in media.markers.values():
        ids.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return sorted(ids)


class RLRunner:
    def __init__(self, cfg, engine, tokenizer, saver, prompts, eval_prompts, stop_ids, output_dir, media=None):
        self.cfg, self.engine, self.tokenizer, self.saver = cfg, engine, tokenizer, saver
        self.media = media
        self.prompts, self.eval_prompts, self.output_dir = prompts, eval_prompts, output_dir
        rl = cfg.rl
        self.method = GRPOMethod(rl, cfg.finetune.stage)
        self.rollout = HFRollout(tokenizer.pad_token_id, stop_ids, max_new_tokens=rl.max_new_tokens,
                                 temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                 suppress_ids=_media_token_ids(tokenizer, media))
        # A bare `reward_model` entry takes its model from reward_model_path.
        funcs = [{"name": "reward_model", "path": rl.reward_model_path} if f == "reward_model" else f
                 for f in rl.reward_funcs]
        self.rewards = build_rewards(funcs)
        self.reference = Reference(cfg, engine.model, needed=rl.kl_coef > 0 and not _no_copy_under_fsdp(cfg, engine))
        if self.reference.mode == "precomputed":
            raise TunesmithError("pref_reference: precomputed does not apply to online RL (responses are new each "
                                 "step); use auto, copy or none")
        self.state = {"global_step": 0, "prompt_epoch": 0, "prompt_index": 0, "tokens_seen": 0}
        self.step_rewards: list[float] = []

    # ---- prompts --------------------------------------------------------------------------------
    def _order(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.cfg.train.seed * 1000003 + epoch)
        return torch.randperm(len(self.prompts), generator=gen).tolist()

    def _next_prompts(self, count: int) -> list[dict]:
        """The next `count` prompts of the shared order; each rank keeps its own share (whole groups)."""
        picked = []
        while len(picked) < count:
            order = self._order(self.state["prompt_epoch"])
            take = order[self.state["prompt_index"] : self.state["prompt_index"] + count - len(picked)]
            picked += [self.prompts[i] for i in take]
            self.state["prompt_index"] += len(take)
            if self.state["prompt_index"] >= len(order):
                self.state.update(prompt_epoch=self.state["prompt_epoch"] + 1, prompt_index=0)
        return picked[dist.rank() :: dist.world()]

    # ---- one step -------------------------------------------------------------------------------
    def _generation_media(self, prompts: list[dict]) -> dict | None:
        """The prompts' processed media (decoded once per rollout) and token types, for generate()."""
        if self.media is None or not any(p["mm_plan"] for p in prompts):
            return None
        inputs, _ = self.media.process(media_plans(prompts))
        device = self.engine.device
        return {k: v.to(device) for k, v in inputs.items() if k in ("pixel_values", "image_grid_thw",
                                                                    "pixel_values_videos", "video_grid_thw")}

    def _rollout(self, prompts: list[dict], greedy: bool = False, generations: int | None = None):
        g = generations or self.cfg.rl.num_generations
        self.rollout.sync(self.engine)
        media = self._generation_media(prompts)
        responses = self.rollout.generate(self.engine.model, [p["ids"] for p in prompts], g, media=media,
                                          greedy=greedy, token_types=self.media.token_ids if media else None)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        expanded = [p for p in prompts for _ in range(g)]
        total, per_fn = self.rewards([p["text"] for p in expanded], texts, [p["sample"] for p in expanded],
                                     lengths=[len(r) for r in responses])
        return expanded, responses, torch.tensor(total), per_fn

    def _collect(self, timing: dict) -> tuple[list, list, torch.Tensor, torch.Tensor, dict, float]:
        """Rollouts for one step; with dynamic sampling, groups whose rewards are all equal are replaced."""
        rl, kept, rounds = self.cfg.rl, None, 0
        zero_share = 0.0
        while True:
            t0 = time.perf_counter()
            prompts, responses, rewards, per_fn = self._rollout(self._next_prompts(rl.prompts_per_step))
            timing["generate"] += time.perf_counter() - t0
            groups = torch.arange(len(prompts)) // rl.num_generations
            flat = zero_variance_groups(rewards, groups)
            zero_share = zero_share or float(flat.float().mean())
            part = (prompts, responses, rewards, groups, per_fn)
            if rl.dynamic_sampling:
                keep = (~flat).nonzero().squeeze(-1).tolist()
                part = ([prompts[i] for i in keep], [responses[i] for i in keep], rewards[keep], groups[keep] + 10**6 * rounds,
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

    @torch.no_grad()
    def _sequence_kl(self, batches) -> torch.Tensor:
        """Per-sequence KL(policy || reference) over the response tokens (kl_in_reward), on CPU."""
        values = []
        for batch in batches:
            mask = batch.targets_BT != IGNORE_INDEX
            policy = batch.extra.get("old_logps_BT")
            if policy is None:
                with self.engine._autocast():
                    policy = response_logps(self.engine.model, batch, self.cfg.rl.temperature)[0]
            kl = kl_penalty(policy, batch.extra["ref_logps_BT"], self.cfg.rl.kl_estimator) * mask
            values.append(kl.sum(-1).float().cpu())
        return torch.cat(values)

    def _micro_batches(self, prompts, responses) -> list:
        rows = [[{"input_ids": p["ids"] + r, "labels": [IGNORE_INDEX] * len(p["ids"]) + r, "mm_plan": p["mm_plan"]}]
                for p, r in zip(prompts, responses)]
        size = self.cfg.train.per_device_train_batch_size
        batches = []
        for start in range(0, len(rows), size):
            batch = collate_rows(rows[start : start + size], self.tokenizer.pad_token_id, media=self.media)
            batches.append(batch.to(self.engine.device))
        return batches

    @torch.no_grad()
    def _attach_old_and_ref(self, batches) -> None:
        rl = self.cfg.rl
        on_policy = rl.ppo_epochs == 1 and rl.num_mini_batches == 1
        for batch in batches:
            if not on_policy:
                with self.engine._autocast():
                    batch.extra["old_logps_BT"] = response_logps(self.engine.model, batch, rl.temperature)[0].detach()
            if self.reference.mode != "none" and rl.kl_coef:
                with self.engine._autocast():
                    batch.extra["ref_logps_BT"] = _ref_token_logps(self.reference, self.engine.model, batch,
                                                                   rl.temperature)

    def _update(self, batches) -> tuple[list[float], dict, int]:
        rl = self.cfg.rl
        batches = _pad_to_same_count(batches)
        losses, sums, count = [], {}, 0
        per_mini = math.ceil(len(batches) / rl.num_mini_batches)
        for _ in range(rl.ppo_epochs):
            for start in range(0, len(batches), per_mini):
                mini = batches[start : start + per_mini]
                norm = max(dist.sum_int(sum(self.method.units(b) for b in mini)), 1)
                step_loss = 0.0
                for batch in mini:
                    out = self.engine.forward_backward(batch, lambda m, b: self.method.loss(m, b, norm))
                    step_loss += float(out.loss.detach())
                    count += out.count
                    for k, v in out.sums.items():
                        sums[k] = sums.get(k, 0.0) + v
                result = self.engine.step()
                losses.append(dist.sum_float(step_loss))
                self.optimizer_steps.append((result.grad_norm, result.lr))
        sums = {k: dist.sum_float(v) for k, v in sorted(sums.items())}
        return losses, sums, dist.sum_int(count)

    def step(self) -> dict:
        self.optimizer_steps: list[tuple[float, float]] = []  # (grad norm, lr) of each update this step
        timing = {"generate": 0.0, "score": 0.0, "train": 0.0}
        t0 = time.perf_counter()
        prompts, responses, rewards, groups, per_fn, zero_share = self._collect(timing)
        t1 = time.perf_counter()
        batches = self._micro_batches(prompts, responses)
        self._attach_old_and_ref(batches)
        if self.cfg.rl.kl_coef and self.cfg.rl.kl_in_reward:
            rewards = rewards - self.cfg.rl.kl_coef * self._sequence_kl(batches)
        advantages = ADVANTAGES[self.cfg.rl.advantage](rewards, groups)
        advantages = clip_advantages(advantages, self.cfg.rl.advantage_clip)
        size = self.cfg.train.per_device_train_batch_size
        for i, batch in enumerate(batches):
            batch.extra["advantages_B"] = advantages[i * size : (i + 1) * size].to(self.engine.device)
        t2 = time.perf_counter()
        losses, sums, count = self._update(batches)
        timing["train"] = time.perf_counter() - t2
        timing["score"] = t1 - t0 - timing["generate"]
        timing["prepare"] = t2 - t1
        return self._step_metrics(responses, rewards, advantages, per_fn, zero_share, losses, sums, count, timing,
                                  sum(len(p["ids"]) + len(r) for p, r in zip(prompts, responses)))

    def _step_metrics(self, responses, rewards, advantages, per_fn, zero_share, losses, sums, count, timing, tokens):
        responses, rewards, advantages, per_fn = _gathered(responses, rewards, advantages, per_fn)
        tokens = dist.sum_int(tokens)
        lengths = torch.tensor([len(r) for r in responses], dtype=torch.float32)
        norms = [n for n, _ in self.optimizer_steps]
        metrics = {"loss": sum(losses) / max(len(losses), 1), "grad_norm": sum(norms) / max(len(norms), 1),
                   "lr": self.optimizer_steps[-1][1] if self.optimizer_steps else 0.0,
                   "reward_mean": float(rewards.mean()),
                   "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
                   "advantage_mean": float(advantages.mean()), "advantage_std": float(advantages.std()),
                   "response_length_mean": float(lengths.mean()), "response_length_max": float(lengths.max()),
                   "zero_variance_group_share": zero_share,
                   "generate_tokens_per_s": float(lengths.sum()) / max(timing["generate"], 1e-9),
                   "train_tokens_per_s": tokens * self.cfg.rl.ppo_epochs / max(timing["train"], 1e-9),
                   **{f"time_{k}": v for k, v in timing.items()}}
        metrics.update({f"reward_{name}": sum(v) / len(v) for name, v in per_fn.items()})
        metrics.update({k: v / max(count, 1) for k, v in sums.items()})
        self.state["tokens_seen"] += tokens
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Greedy answers on the held-out prompts: the mean of each reward function."""
        prompts = self.eval_prompts[: self.cfg.rl.eval_num_prompts][dist.rank() :: dist.world()]
        if not prompts:
            return {}
        responses, _, rewards, per_fn = self._rollout(prompts, greedy=True, generations=1)
        _, rewards, _, per_fn = _gathered(responses, rewards, rewards, per_fn)
        out = {"eval_reward_mean": float(rewards.mean())}
        out.update({f"eval_reward_{k}": sum(v) / len(v) for k, v in per_fn.items()})
        return out

    def save(self) -> None:
        state = {**self.state, "rewards": self.rewards.state_dict()}
        ckpt.save_checkpoint(self.output_dir, self.state["global_step"], self.engine, self.saver, state,
                             only_model=self.cfg.output.save_only_model)
        ckpt.rotate(self.output_dir, self.cfg.output.save_total_limit)

    def restore(self, path) -> None:
        if not getattr(self.engine, "loads_model_state", False):  # sharded engines restore their own weights
            ckpt.load_model_weights(self.engine.model, path)
        self.engine.load(path)
        state = json.loads((path / "trainer_state.json").read_text())
        self.rewards.load_state_dict(state.pop("rewards", {}))
        self.state.update(state)
        ckpt.set_rng_state(json.loads((path / "rng_state.json").read_text()))


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
    most = _max_over_ranks(len(batches))
    padded = list(batches)
    while len(padded) < most:
        dummy = copy.copy(batches[-1])
        dummy.targets_BT = torch.full_like(batches[-1].targets_BT, IGNORE_INDEX)
        dummy.num_label_tokens, dummy.num_samples, dummy.num_tokens = 0, 0, 0
        dummy.extra = dict(batches[-1].extra)
        padded.append(dummy)
    return padded


def _max_over_ranks(value: int) -> int:
    if dist.world() == 1:
        return value
    import torch.distributed as tdist

    t = torch.tensor([value], device=dist._device())
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return int(t.item())


def _ref_token_logps(reference, model, batch, temperature: float):
    if reference.mode == "adapters_off":
        with model.disable_adapter():
            return response_logps(model, batch, temperature)[0]
    return response_logps(reference.model, batch, temperature)[0]


def _concat(a: tuple, b: tuple) -> tuple:
    per_fn = {k: a[4][k] + b[4][k] for k in a[4]}
    return (a[0] + b[0], a[1] + b[1], torch.cat([a[2], b[2]]), torch.cat([a[3], b[3]]), per_fn)


def run_rl(cfg, engine, tokenizer, saver, prompts, eval_prompts, stop_ids, output_dir, resume, total_steps, media=None):
    """Drive RLRunner: progress bar, logging, evaluation, checkpoints, SIGTERM."""
    from .loop import TrainResult, _StopFlag
    from .metrics import build_sinks, plot_loss
    from .progress import TrainProgress

    runner = RLRunner(cfg, engine, tokenizer, saver, prompts, eval_prompts, stop_ids, output_dir, media)
    if resume is not None:
        runner.restore(resume)
    result = TrainResult(output_dir, runner.state["global_step"])
    sinks = build_sinks(cfg, output_dir, append=resume is not None) if dist.is_main() else []
    try:
        if cfg.train.eval_strategy != "no" and runner.state["global_step"] == 0:
            _log(sinks, None, 0, runner.evaluate(), result)
        with _StopFlag() as stop, TrainProgress(total_steps, runner.state["global_step"]) as bar:
            while runner.state["global_step"] < total_steps:
                metrics = runner.step()
                runner.state["global_step"] += 1
                step = runner.state["global_step"]
                result.step_losses.append(metrics["loss"])
                result.global_step = step
                bar.update(step, metrics["reward_mean"])
                if step % cfg.output.logging_steps == 0 or step == total_steps:
                    _log(sinks, bar, step, metrics, result)
                eval_every = cfg.train.eval_steps or cfg.output.logging_steps
                if cfg.train.eval_strategy == "steps" and (step % eval_every == 0 or step == total_steps):
                    _log(sinks, bar, step, runner.evaluate(), result)
                if (cfg.output.save_strategy == "steps" and step % cfg.output.save_steps == 0) or stop.requested:
                    runner.save()
                if stop.requested:
                    result.interrupted = True
                    log.warning("stopped at step %d; resume with resume_from_checkpoint: true", step)
                    return result
    finally:
        for sink in sinks:
            sink.close()
    engine.export_hf(output_dir, saver)
    if not dist.is_main():
        return result
    summary = {**runner.state, **result.eval_metrics}
    if torch.cuda.is_available():
        summary["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    (output_dir / "train_summary.json").write_text(json.dumps(summary, indent=1))
    if cfg.output.plot_loss:
        plot_loss(output_dir)
    return result


def _log(sinks, bar, step: int, metrics: dict, result) -> None:
    if not metrics:
        return
    if any(k.startswith("eval_") for k in metrics):
        result.eval_metrics = metrics
    if bar is not None:
        bar.print_metrics(step, metrics)
    for sink in sinks:
        sink.log(metrics, step)
