"""engines/megatron/parallel.py and the process checks: vocabulary padding for tensor-parallel shards, which
parallel layouts run over several processes and which are refused by name. The runs themselves:
tests/e2e/test_megatron_parallel_cli.py."""

import pytest
import torch

pytest.importorskip("megatron.core")

from tunesmith.config.schema import MegatronConfig  # noqa: E402
from tunesmith.engines.megatron import _check_processes  # noqa: E402
from tunesmith.engines.megatron.parallel import pad_vocab  # noqa: E402
from tunesmith.engines.megatron.shards import shard, unshard  # noqa: E402
from tunesmith.errors import TunesmithError  # noqa: E402


def test_vocabulary_rows_are_padded_so_every_rank_holds_an_equal_part_and_come_back_whole():
    embed = torch.arange(10 * 3, dtype=torch.float32).view(10, 3)
    padded = pad_vocab("embedding.word_embeddings.weight", embed, tp=2)
    assert padded.shape == (256, 3) and padded[10:].abs().sum() == 0
    pieces = [shard("embedding.word_embeddings.weight", padded, 2, r) for r in range(2)]
    assert [p.shape[0] for p in pieces] == [128, 128]
    torch.testing.assert_close(unshard("embedding.word_embeddings.weight", pieces)[:10], embed)
    norm = torch.ones(3)
    assert pad_vocab("decoder.final_layernorm.weight", norm, tp=2) is norm  # only vocabulary rows
    assert pad_vocab("output_layer.weight", embed, tp=1) is embed


@pytest.mark.parametrize("settings, refused", [
    ({"pipeline_model_parallel_size": 2}, "pipeline_model_parallel_size: 2"),
    ({"expert_model_parallel_size": 2}, "expert_model_parallel_size: 2"),
    ({"tensor_model_parallel_size": 2, "sequence_parallel": True}, "sequence_parallel: true"),
])
def test_layouts_not_run_yet_are_refused_naming_the_key_and_the_alternative(settings, refused):
    with pytest.raises(TunesmithError, match=refused) as err:
        _check_processes(MegatronConfig(**settings), 4, lora=False, vision_language=False, moe=False)
    assert "backend: fsdp2 or deepspeed" in str(err.value)


@pytest.mark.parametrize("kind", ["lora", "vision_language", "moe"])
def test_tensor_parallelism_is_refused_for_what_it_does_not_shard_yet(kind):
    flags = {"lora": False, "vision_language": False, "moe": False, kind: True}
    with pytest.raises(TunesmithError, match="tensor_model_parallel_size: 2"):
        _check_processes(MegatronConfig(tensor_model_parallel_size=2), 2, **flags)
    _check_processes(MegatronConfig(), 2, **flags)  # data parallelism alone takes them


def test_tensor_and_data_parallelism_of_a_dense_text_model_run():
    _check_processes(MegatronConfig(tensor_model_parallel_size=2), 4, lora=False, vision_language=False, moe=False)
