"""Megatron degrees against the world size and the model: each problem names the key and the fix (pure)."""

from tunesmith.config.schema import MegatronConfig
from tunesmith.engines.megatron.degrees import ModelFacts, degree_problems

DENSE = ModelFacts(num_layers=28, num_heads=16, num_kv_heads=8)
MOE = ModelFacts(num_layers=48, num_heads=32, num_kv_heads=4, num_experts=128)


def _problems(world=8, model=DENSE, **keys):
    return degree_problems(MegatronConfig(**keys), world, model)


def test_defaults_fit_any_world_size():
    assert _problems(world=1) == [] and _problems(world=8, model=MOE) == []


def test_degrees_that_fit_pass():
    assert _problems(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, sequence_parallel=True) == []
    assert _problems(model=MOE, pipeline_model_parallel_size=4, expert_model_parallel_size=2,
                     use_distributed_optimizer=True, overlap_param_gather=True, recompute_granularity="full") == []
    assert _problems(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2) == []


def test_world_size_must_be_a_multiple_of_the_model_parallel_size():
    (text,) = _problems(world=6, tensor_model_parallel_size=4)
    assert "4 x 1 x 1 = 4 does not divide the 6 processes" in text and "launch a multiple of 4" in text


def test_heads_and_kv_heads_must_split_evenly():
    problems = _problems(world=3, tensor_model_parallel_size=3)
    assert any("does not divide the model's 16 attention heads" in p for p in problems)
    assert any("8 key/value heads" in p and "use a divisor of 8" in p for p in problems)
    (kv,) = _problems(world=16, tensor_model_parallel_size=16)
    assert "tensor_model_parallel_size: 16 does not divide the model's 8 key/value heads" in kv


def test_layers_must_split_over_stages_and_virtual_stages():
    (text,) = _problems(pipeline_model_parallel_size=8)
    assert "pipeline_model_parallel_size = 8 does not divide the model's 28 layers" in text
    (text,) = _problems(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=4)
    assert "x virtual_pipeline_model_parallel_size = 8" in text
    (text,) = _problems(virtual_pipeline_model_parallel_size=2)
    assert "needs pipeline_model_parallel_size > 1" in text


def test_experts():
    (text,) = _problems(expert_model_parallel_size=2)
    assert "expert_model_parallel_size: 2 on a dense model" in text
    problems = _problems(model=MOE, expert_model_parallel_size=3, world=6)
    assert any("does not divide the model's 128 experts" in p for p in problems)
    (text,) = _problems(moe_token_dispatcher_type="alltoall")
    assert "on a dense model" in text


def test_switches_that_need_another_setting():
    assert "needs tensor_model_parallel_size > 1" in _problems(sequence_parallel=True)[0]
    (moe_tp,) = _problems(model=MOE, tensor_model_parallel_size=2)
    assert "needs sequence_parallel: true" in moe_tp
    assert _problems(model=MOE, tensor_model_parallel_size=2, sequence_parallel=True) == []
    assert "needs use_distributed_optimizer: true" in _problems(overlap_param_gather=True)[0]
    assert _problems(context_parallel_size=2) == []  # torch-native attention (context_parallel.py)
    assert "needs recompute_granularity: full" in _problems(recompute_num_layers=2)[0]
    assert _problems(model=MOE, recompute_granularity="full") == []
    assert "more than the 14 layers" in _problems(recompute_granularity="full", recompute_num_layers=20,
                                                  pipeline_model_parallel_size=2)[0]


def test_every_problem_is_reported_at_once():
    problems = _problems(world=6, tensor_model_parallel_size=4, pipeline_model_parallel_size=8, sequence_parallel=False,
                         expert_model_parallel_size=2)
    assert len(problems) >= 3


def test_what_does_not_run_yet_is_named_with_the_alternative():
    from tunesmith.engines.megatron.degrees import unavailable_problems

    def problems(model=DENSE, **keys):
        return unavailable_problems(MegatronConfig(**keys), model)

    # dense, full or LoRA: TP, PP (and DP) run
    assert problems(tensor_model_parallel_size=2, pipeline_model_parallel_size=2) == []
    assert problems(model=MOE) == []
    # pipeline and expert parallelism run for MoE models (LLaMA-Factory's qwen3_moe_full.yaml: PP=4, EP=2)
    assert problems(model=MOE, pipeline_model_parallel_size=4, expert_model_parallel_size=2) == []
    # tensor parallelism for MoE models: with sequence parallelism (degree_problems), with expert parallelism too
    assert problems(model=MOE, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                    sequence_parallel=True) == []
    assert problems(model=MOE, tensor_model_parallel_size=2, expert_model_parallel_size=2, sequence_parallel=True) == []
    (text,) = problems(model=MOE, tensor_model_parallel_size=2, sequence_parallel=True, overlap_grad_reduce=True)
    assert "overlap_grad_reduce for a mixture-of-experts model" in text and "overlap_grad_reduce: false" in text
    assert problems(tensor_model_parallel_size=2, sequence_parallel=True) == []
    # the interleaved schedule
    assert problems(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2) == []
    assert problems(model=MOE, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2) == []
    # context parallelism
    assert problems(context_parallel_size=2, tensor_model_parallel_size=2, pipeline_model_parallel_size=2) == []
    assert problems(model=MOE, context_parallel_size=2, expert_model_parallel_size=2) == []


def test_qwen3_vl_deepstack_layers_must_be_on_the_first_pipeline_stage():
    qwen3_vl = ModelFacts(num_layers=4, num_heads=16, num_kv_heads=8, deepstack_layers=3)
    (text,) = _problems(world=2, model=qwen3_vl, pipeline_model_parallel_size=2)
    assert "deepstack features after its first 3 decoder layers" in text and "at most 1" in text
    assert _problems(world=2, model=ModelFacts(num_layers=8, num_heads=16, num_kv_heads=8, deepstack_layers=3),
                     pipeline_model_parallel_size=2) == []
