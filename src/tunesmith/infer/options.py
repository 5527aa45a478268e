"""Keys of `tunesmith chat`, `serve` and `export`: flags, key=value items and LLaMA-Factory YAMLs.

LLaMA-Factory users run `llamafactory-cli chat|api|export cfg.yaml`; the same files work here:

    tunesmith chat examples/inference/qwen3_lora_sft.yaml --prompt "Who are you?"
    tunesmith serve examples/inference/qwen3_lora_sft.yaml
    tunesmith export examples/merge_lora/qwen3_lora_sft.yaml

Later values win: the YAML file, then `key=value` / `--key value` items, then the named flags
(`--model`, `--prompt`, ...). Every key is one of:

- honoured: a field of the groups the command reads (MODEL for all; GENERATION, MEDIA and VLLM
  for chat and serve; SERVE for serve; EXPORT for export);
- for another command: export keys in a chat YAML, generation keys in a merge YAML, server keys
  in a chat YAML. They change nothing here and are listed once in the log (LLaMA-Factory accepts
  them in both too);
- no effect: LLaMA-Factory keys that change nothing in tunesmith (NO_EFFECT), and the training
  keys of the model, data and finetune groups (`dataset`, `cutoff_len`, `stage`, ...), listed
  once in the log;
- refused: a feature tunesmith does not have (REFUSED, `infer_backend: sglang`,
  `export_legacy_format: true`), `infer_backend: vllm` when vLLM is not installed, a vllm_* key
  with another backend, or a training-only key (`learning_rate`, `output_dir`, ...), with what
  to do instead.

Any other key is an error with a "did you mean". All problems are reported at once.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..config.schema import DataConfig, split_names
from ..errors import ConfigError

log = logging.getLogger("tunesmith")


class _Keys(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class ModelKeys(_Keys):
    model_name_or_path: str = Field(
        description="The model: a run's output_dir (full model or LoRA adapter), a model folder, a hub id or "
        "tiny:<arch>; with adapter_name_or_path, the base model the adapter is applied to.")
    adapter_name_or_path: list[str] = Field(
        default_factory=list, description="LoRA adapter folder(s) applied to model_name_or_path, comma-separated "
        "for several (all but the last are merged first, as in LLaMA-Factory).")
    template: str = Field("auto", description="Chat template: auto (the tokenizer's own) or a name "
                          "(qwen3, qwen3_nothink, chatml, llama3, ...); export saves it into the tokenizer.")
    finetuning_type: Literal["lora", "oft", "full", "freeze"] | None = Field(
        None, description="How the model was trained; only lora and oft take adapter_name_or_path.")
    trust_remote_code: bool = Field(False, description="Allow model code from the hub (off unless you trust it).")
    infer_backend: Literal["huggingface", "vllm"] = Field(
        "huggingface", description="Generation backend of chat and serve: huggingface (transformers generate) "
        "or vllm (needs `pip install 'tunesmith[vllm]'` and a GPU).")
    infer_dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="Weights dtype: auto = float32 for chat, bfloat16 for export.")
    cache_dir: str | None = Field(None, description="Where hub downloads are cached.")
    model_revision: str = Field("main", description="Hub revision (branch, tag or commit).")
    quantization_bit: Literal[4, 8] | None = Field(
        None, description="chat / serve (huggingface backend): load the model's linear layers quantized to 4 or 8 "
        "bits with bitsandbytes (pip install 'tunesmith[qlora]'), as LLaMA-Factory's on-the-fly quantization; an "
        "adapter stays unmerged on top. Not for export (merge into the unquantized model).")
    quantization_method: Literal["bnb", "bitsandbytes"] = Field(
        "bnb", description="bitsandbytes only (LLaMA-Factory's hqq and eetq are not available).")
    quantization_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit quantization data type.")
    double_quantization: bool = Field(True, description="4-bit: quantize the quantization constants too.")

    _split = field_validator("adapter_name_or_path", mode="before")(classmethod(lambda cls, v: split_names(v)))


class GenerationKeys(_Keys):
    max_new_tokens: int = Field(1024, ge=1, description="Longest answer in tokens (LLaMA-Factory's default).")
    temperature: float = Field(0.0, ge=0, description="0 = greedy (the default; LLaMA-Factory samples at 0.95 by "
                               "default), > 0 samples.")
    do_sample: bool | None = Field(
        None, description="Sample (true) or decode greedily (false); default: sample when temperature > 0. "
        "do_sample: true without a temperature uses LLaMA-Factory's 0.95.")
    top_p: float = Field(0.7, gt=0, le=1, description="Nucleus sampling when sampling (LLaMA-Factory's default).")
    top_k: int | None = Field(50, ge=0, description="Keep the k likeliest tokens when sampling (LLaMA-Factory's "
                              "default; 0 or null: off).")
    num_beams: int = Field(1, ge=1, description="Beam search width; 1 = no beam search.")
    repetition_penalty: float = Field(1.0, gt=0, description="1.0 = no penalty.")
    length_penalty: float = Field(1.0, description="Exponential length penalty of beam search.")
    skip_special_tokens: bool = Field(True, description="Drop special tokens from the shown answer.")
    default_system: str | None = Field(None, description="System prompt when --system is not given.")
    enable_thinking: bool = Field(True, description="For reasoning templates (qwen3): let the model think; "
                                  "false closes an empty think block in the prompt.")

    def generate_kwargs(self) -> dict:
        """Keyword arguments for `model.generate` (sampling settings only when sampling)."""
        sample = self.do_sample if self.do_sample is not None else self.temperature > 0
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": sample,
                                  "num_beams": self.num_beams}
        if sample:
            kwargs["temperature"] = self.temperature or 0.95
            kwargs["top_p"] = self.top_p
            kwargs["top_k"] = self.top_k or 0  # 0: off (not the model's generation_config value)
        if self.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = self.repetition_penalty
        if self.num_beams > 1 and self.length_penalty != 1.0:
            kwargs["length_penalty"] = self.length_penalty
        return kwargs


class MediaKeys(_Keys):
    """Budgets for --image/--video/--audio; unset ones come from the run's saved config."""

    image_max_pixels: int | None = Field(None, ge=1, description="Largest image in pixels.")
    image_min_pixels: int | None = Field(None, ge=1, description="Smallest image in pixels.")
    video_max_pixels: int | None = Field(None, ge=1, description="Largest video frame in pixels.")
    video_min_pixels: int | None = Field(None, ge=1, description="Smallest video frame in pixels.")
    video_fps: float | None = Field(None, gt=0, description="Video frames sampled per second.")
    video_maxlen: int | None = Field(None, ge=1, description="Most video frames sampled.")
    audio_sampling_rate: int | None = Field(None, ge=1, description="Audio sampling rate in Hz.")
    use_audio_in_video: bool | None = Field(None, description="Also feed a video's sound track (Qwen2.5-Omni).")

    def overrides(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class VllmKeys(_Keys):
    """LLaMA-Factory's vLLM settings; read only with infer_backend: vllm."""

    vllm_maxlen: int = Field(4096, ge=16, description="vLLM: longest prompt + answer in tokens (the context the "
                             "server allows).")
    vllm_gpu_util: float = Field(0.7, gt=0, le=1, description="vLLM: share of GPU memory for weights and KV cache.")
    vllm_enforce_eager: bool = Field(False, description="vLLM: no CUDA graphs (slower, less memory).")
    vllm_max_lora_rank: int = Field(32, ge=1, description="vLLM: the largest LoRA rank that can be served.")
    vllm_config: dict | str | None = Field(None, description="vLLM: more engine arguments, a mapping or its JSON "
                                           "text (e.g. {\"tensor_parallel_size\": 2}).")

    @field_validator("vllm_config", mode="before")
    @classmethod
    def _json(cls, value):
        if isinstance(value, str) and value.strip():
            import json

            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"not a JSON object: {err}") from None
        if value is not None and not isinstance(value, dict):
            raise ValueError("give a mapping of vLLM engine arguments")
        return value or None


class ServeKeys(_Keys):
    """`tunesmith serve`: where it listens, what it serves and the limits of one request."""

    host: str | None = Field(None, description="Address to bind; default API_HOST, else 127.0.0.1 (this machine "
                             "only). Any other address needs the API_KEY environment variable.")
    port: int | None = Field(None, ge=0, le=65535, description="Port; default API_PORT, else 8000 (0: a free one).")
    served_model_name: str | None = Field(None, description="Name of the model in requests and /v1/models "
                                          "(default: model_name_or_path as given).")
    lora_modules: list[str] = Field(default_factory=list, description="More LoRA adapters of the same base, served "
                                    "side by side: name=path items (comma-separated, or --adapter name=path); a "
                                    "request picks one by its model name.")
    max_request_mb: float = Field(20, gt=0, description="Largest request body in MB (images in base64 count).")
    max_concurrent: int = Field(4, ge=1, description="Requests generating at once; later ones wait in a queue.")
    max_queue: int = Field(100, ge=0, description="Requests that may wait for a slot; one more is refused (429).")
    allow_local_media: bool | None = Field(None, description="Let image_url name a file on the server (a path or "
                                           "file:// URL); default: only when bound to a loopback address.")

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _split(cls, value):
        if value is None:
            return []
        if isinstance(value, dict):
            return [f"{name}={path}" for name, path in value.items()]
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @field_validator("lora_modules")
    @classmethod
    def _pairs(cls, value):
        for item in value:
            name, _, path = item.partition("=")
            if not name.strip() or not path.strip():
                raise ValueError(f"'{item}' is not name=path (e.g. support=saves/qwen3-lora)")
        return value

    def adapters(self) -> dict[str, str]:
        """name -> adapter folder, in the order given."""
        return {name.strip(): path.strip() for name, _, path in (i.partition("=") for i in self.lora_modules)}


class ExportKeys(_Keys):
    export_dir: str = Field(description="New folder for the merged, standalone model.")
    export_size: int | float | str = Field(5, description="Largest safetensors shard: GB as an int (LLaMA-Factory's "
                                   "5) or a size string (5GB, 500MB).")
    export_device: Literal["cpu", "auto"] = Field("cpu", description="Merge on the CPU, or auto: on the GPU "
                                                  "when there is one (faster).")
    export_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        None, description="dtype of the written weights (default: infer_dtype, else bfloat16).")
    export_legacy_format: bool = Field(False, description="false: safetensors (the only format tunesmith writes).")

    @field_validator("export_size")
    @classmethod
    def _size(cls, value):
        if isinstance(value, str) and value.strip().replace(".", "", 1).isdigit():
            value = float(value) if "." in value else int(value)  # `--export_size 5`: GB, as in the YAML
        if isinstance(value, bool) or (isinstance(value, (int, float)) and value <= 0):
            raise ValueError("give a positive number of GB (5) or a size such as 5GB")
        return value

    @property
    def max_shard_size(self) -> str:
        """The size string save_pretrained takes (whole units only: 0.5 GB becomes 500MB)."""
        size = self.export_size
        if isinstance(size, (int, float)):
            return f"{int(size)}GB" if float(size).is_integer() else f"{round(size * 1000)}MB"
        return str(size)


class PredictKeys(_Keys):
    """Batch prediction: `tunesmith train` with do_predict (LLaMA-Factory's nlg_eval YAML)."""

    do_predict: bool = Field(True, description="true: answer every record of eval_dataset (this command).")
    predict_with_generate: bool = Field(True, description="Generate the answers (LLaMA-Factory's predict mode); "
                                        "false, a prediction loss without generating, is refused.")
    do_train: bool = Field(False, description="false (LLaMA-Factory's default): predict only; true with "
                           "do_predict is refused (train first, then predict with the trained output_dir).")
    do_eval: bool = Field(False, description="false: an evaluation loss with do_predict is refused.")
    eval_dataset: list[str] = Field(default_factory=list, description="The datasets whose records are answered "
                                    "(names from dataset_info.json, comma-separated).")
    dataset: list[str] = Field(default_factory=list, description="Answered when eval_dataset is not given.")
    val_size: float | int = Field(0, ge=0, description="Without eval_dataset: answer this held-out split of "
                                  "dataset (a fraction below 1 or a count), as LLaMA-Factory does.")
    dataset_dir: str = Field("data", description="The folder that holds dataset_info.json.")
    stage: str = Field("sft", description="The stage of the YAML: one that trains on conversations (sft).")
    skip_bad_samples: bool = Field(False, description="Skip (and count) records that cannot be answered instead "
                                   "of stopping.")
    max_samples: int | None = Field(None, ge=1, description="Answer at most this many records of each dataset.")
    output_dir: str = Field(description="Where generated_predictions.jsonl and predict_results.json go.")
    overwrite_output_dir: bool = Field(False, description="Replace the predictions an earlier run left there.")
    per_device_eval_batch_size: int = Field(1, ge=1, description="Records answered at once: vLLM batches "
                                            "them; transformers runs text-only ones as one padded generate.")
    seed: int = Field(42, description="Seeds sampling (temperature > 0).")
    identity_name: str = DataConfig.model_fields["identity_name"]  # training's key: its default and meaning
    identity_author: str = DataConfig.model_fields["identity_author"]

    _names = field_validator("eval_dataset", "dataset", mode="before")(classmethod(lambda cls, v: split_names(v)))


CHAT_GROUPS: dict[str, type[_Keys]] = {"model": ModelKeys, "generation": GenerationKeys, "media": MediaKeys,
                                       "vllm": VllmKeys}
SERVE_GROUPS: dict[str, type[_Keys]] = {**CHAT_GROUPS, "serve": ServeKeys}
EXPORT_GROUPS: dict[str, type[_Keys]] = {"model": ModelKeys, "export": ExportKeys}
PREDICT_GROUPS: dict[str, type[_Keys]] = {**CHAT_GROUPS, "predict": PredictKeys}
# Which command reads a key that another command's YAML holds (the first command listed that has it).
COMMAND_GROUPS: dict[str, dict[str, type[_Keys]]] = {"chat": CHAT_GROUPS, "export": EXPORT_GROUPS,
                                                     "serve": SERVE_GROUPS}
ALL_GROUPS: dict[str, type[_Keys]] = {**SERVE_GROUPS, **EXPORT_GROUPS}

_VLLM = ("only used by infer_backend sglang/ktransformers, which tunesmith does not have; generation runs on "
         "transformers (infer_backend: huggingface) or vLLM (infer_backend: vllm); remove the key")
_EXPORT_QUANT = ("quantized (GPTQ) export is not available; export unquantized, then quantize the folder with "
                 "a quantization tool (e.g. gptqmodel or llm-compressor)")

# LLaMA-Factory keys for features tunesmith does not have, with what to do instead.
REFUSED: dict[str, str] = {
    **{k: _VLLM for k in ("sglang_maxlen", "sglang_mem_fraction", "sglang_tp_size", "sglang_config",
                          "sglang_lora_backend", "use_kt", "kt_optimize_rule", "cpu_infer", "chunk_size", "mode",
                          "kt_maxlen", "kt_use_cuda_graph", "kt_mode", "kt_force_think")},
    **{k: _EXPORT_QUANT for k in ("export_quantization_bit", "export_quantization_dataset",
                                  "export_quantization_nsamples", "export_quantization_maxlen")},
    "export_hub_model_id": ("tunesmith export does not upload to the hub (it works offline); export to export_dir, "
                            "then upload the folder with `hf upload <repo_id> <export_dir>` "
                            "(older huggingface_hub: `huggingface-cli upload <repo_id> <export_dir>`)"),
    "adapter_folder": "give the adapter folder(s) in adapter_name_or_path (comma-separated for several)",
    "rope_scaling": ("a model trained with rope_scaling brings its scaling (a full model in config.json, a LoRA "
                     "adapter in its run's tunesmith_config.yaml); scaling another at inference is not available; "
                     "remove the key"),
    "shift_attn": "shift short attention (LongLoRA) is not supported; remove the key",
    "mixture_of_depths": "mixture-of-depths is not supported; remove the key",
    "use_unsloth": "unsloth is not supported; remove the key",
    "add_tokens": "adding tokens at inference is not available; the tokens come from the trained tokenizer",
    "add_special_tokens": "adding tokens at inference is not available; the tokens come from the trained tokenizer",
    "new_special_tokens_config": "adding tokens at inference is not available; the tokens come from the trained "
                                 "tokenizer",
    "resize_vocab": "resizing the vocabulary at inference is not available; remove the key",
}

# LLaMA-Factory keys that change nothing in tunesmith's chat/export (said once in the log).
NO_EFFECT: dict[str, str] = {
    "max_length": "max_new_tokens bounds the answer (LLaMA-Factory also drops max_length when max_new_tokens > 0)",
    "low_cpu_mem_usage": "weights always load lazily",
    "use_fast_tokenizer": "the fast tokenizer is always used",
    "split_special_tokens": "special tokens are never split",
    "offload_folder": "no offloading at inference",
    "use_kv_cache": "the KV cache is always used for generation",
    "print_param_status": "not printed",
    "disable_gradient_checkpointing": "no gradients at inference",
    "use_unsloth_gc": "no gradients at inference",
    "use_reentrant_gc": "no gradients at inference",
    "upcast_layernorm": "not used at inference",
    "quantization_device_map": "the quantized model loads on the device chat / serve picks",
    "upcast_lmhead_output": "not used at inference",
    "moe_aux_loss_coef": "no loss at inference",
    "train_from_scratch": "inference loads trained weights",
    "use_v1_kernels": "not used",
    "image_do_pan_and_scan": "the model's processor settings are used",
    "crop_to_patches": "the model's processor settings are used",
    "hf_hub_token": "set HF_TOKEN in the environment instead (never in a file)",
    "ms_hub_token": "ModelScope is not used",
    "om_hub_token": "Modelers is not used",
    "tool_format": "tools are rendered by the chat template",
    "ddp_timeout": "one process; no collective to time out",
    "report_to": "no metric sinks at inference",
    "dataloader_num_workers": "no data loader at inference",
}

# Training-schema groups whose keys LLaMA-Factory's chat/export also accept (model, data, finetuning
# arguments): no effect here. Keys of the other groups are training-only and refused.
_QUIET_TRAINING_GROUPS = ("model", "data", "finetune")


def _training_keys() -> dict[str, str]:
    from ..config.schema import GROUPS

    return {key: group for group, cls in GROUPS.items() for key in cls.model_fields}


@dataclass(frozen=True)
class ChatOptions:
    model: ModelKeys
    generation: GenerationKeys
    media: MediaKeys


    vllm: VllmKeys = VllmKeys()


@dataclass(frozen=True)
class ServeOptions(ChatOptions):
    serve: ServeKeys = ServeKeys()


@dataclass(frozen=True)
class PredictOptions(ChatOptions):
    predict: PredictKeys = None  # type: ignore[assignment]  (always given by predict_options)


@dataclass(frozen=True)
class ExportOptions:
    model: ModelKeys
    export: ExportKeys


def chat_options(flat: dict[str, Any]) -> ChatOptions:
    groups = _parse(flat, CHAT_GROUPS, "chat")
    return ChatOptions(**groups)


def serve_options(flat: dict[str, Any]) -> ServeOptions:
    groups = _parse(flat, SERVE_GROUPS, "serve")
    return ServeOptions(**groups)


def predict_options(flat: dict[str, Any]) -> PredictOptions:
    from ..config.schema import GROUPS
    from ..stages import STAGES

    # a training YAML with do_predict: true added predicts: its training keys change nothing here
    groups = _parse(flat, PREDICT_GROUPS, "train", quiet_groups=tuple(GROUPS), quiet_lf=True)
    problems = []
    keys = groups["predict"]
    stage = STAGES.get(keys.stage)
    if stage is None or stage.data_kind != "conversations":
        problems.append(f"stage: {keys.stage} with do_predict: batch prediction generates answers to conversations "
                        "(an SFT stage); a reward model's scores come from `tunesmith score` or `tunesmith eval`")
    if not keys.predict_with_generate:
        problems.append("predict_with_generate: false asks for a prediction loss without generating, which is not "
                        "available; set predict_with_generate: true (answers are generated and scored)")
    if keys.do_train:
        problems.append("do_train: true with do_predict: true: train first, then predict in a second run with "
                        "model_name_or_path (or adapter_name_or_path) set to the trained output_dir and do_train: "
                        "false")
    if keys.do_eval:
        problems.append("do_eval: true with do_predict: true: an evaluation loss is computed while training "
                        "(eval_strategy); remove do_eval")
    if problems:
        raise ConfigError(problems)
    return PredictOptions(**groups)


def export_options(flat: dict[str, Any]) -> ExportOptions:
    groups = _parse(flat, EXPORT_GROUPS, "export")
    return ExportOptions(**groups)


def _parse(flat: dict[str, Any], groups: dict[str, type[_Keys]], command: str,
           quiet_groups: tuple[str, ...] = _QUIET_TRAINING_GROUPS, quiet_lf: bool = False) -> dict[str, _Keys]:
    problems: list[str] = []
    routed, idle = _route(flat, groups, command, problems, quiet_groups, quiet_lf)
    parsed = _validate(routed, groups, problems)
    problems.extend(_cross_checks(flat, parsed))
    if problems:
        raise ConfigError(problems)
    if idle:
        log.warning("no effect on `tunesmith %s`: %s", command, "; ".join(idle))
    return parsed


def _route(flat: dict[str, Any], groups: dict[str, type[_Keys]], command: str, problems: list[str],
           quiet_groups: tuple[str, ...], quiet_lf: bool = False) -> tuple[dict[str, dict], list[str]]:
    """Each key to its group of this command, or into `idle` (no effect) or `problems` (refused / unknown). Keys
    of the training groups in `quiet_groups` are idle, the other training keys refused; `quiet_lf`: every key of
    LLaMA-Factory's training arguments is idle too (a training YAML turned into a prediction one)."""
    from ..config.lf_keys import LF_KEYS

    own = {key: name for name, cls in groups.items() for key in cls.model_fields}
    other = {key for cls in ALL_GROUPS.values() for key in cls.model_fields} - set(own)
    training = _training_keys()
    routed: dict[str, dict] = {name: {} for name in groups}
    idle: list[str] = []
    for key, value in flat.items():
        if key in own:
            routed[own[key]][key] = value
        elif key in REFUSED:
            problems.append(f"'{key}': {REFUSED[key]}")
        elif key in other:
            idle.append(f"{key} (a `tunesmith {_reader_of(key)}` key)")
        elif key in NO_EFFECT:
            idle.append(f"{key} ({NO_EFFECT[key]})")
        elif (key in training and training[key] in quiet_groups) or (quiet_lf and key in LF_KEYS):
            idle.append(f"{key} (a training key)")
        elif key in training:
            problems.append(f"'{key}' is a training key; `tunesmith {command}` does not read it: remove it "
                            f"(see `tunesmith {command} --help` for the keys it takes)")
        else:
            known = list(own) + list(other) + list(REFUSED) + list(NO_EFFECT) + list(training)
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; see `tunesmith {command} --help` for the keys"
            problems.append(f"unknown key '{key}'{hint}")
    return routed, idle


def _reader_of(key: str) -> str:
    return next(command for command, groups in COMMAND_GROUPS.items()
                if any(key in cls.model_fields for cls in groups.values()))


def _validate(routed: dict[str, dict], groups: dict[str, type[_Keys]], problems: list[str]) -> dict[str, _Keys]:
    """Validate each group; a bad value is reported and its key dropped, so every problem comes out at once."""
    parsed: dict[str, _Keys] = {}
    for name, cls in groups.items():
        values = dict(routed[name])
        if name == "model" and values.get("infer_backend", "huggingface") not in ("huggingface", "vllm"):
            problems.append(f"infer_backend: {values.pop('infer_backend')}: tunesmith has no SGLang/KTransformers "
                            "inference; use infer_backend: huggingface (transformers generate) or vllm")
        if name == "export" and values.get("export_legacy_format") is True:
            values.pop("export_legacy_format")
            problems.append("export_legacy_format: true asks for pickled .bin weights; tunesmith writes "
                            "safetensors only: set export_legacy_format: false or remove it")
        for _ in range(len(values) + 1):
            try:
                parsed[name] = cls(**values)
                break
            except ValidationError as err:
                seen: set[str] = set()
                for e in err.errors():
                    key = str(e["loc"][0]) if e["loc"] else ""
                    if key in seen:  # a union type reports one error per member: say it once
                        continue
                    seen.add(key)
                    if e["type"] == "missing":
                        problems.append(f"'{key}' is required: {_REQUIRED[key]}")
                        values[key] = "?"
                    else:
                        problems.append(f"'{key}' = {e.get('input')!r}: {e['msg']}")
                        values.pop(key, None)
    return parsed


_REQUIRED = {"model_name_or_path": "give --model DIR, or model_name_or_path in cfg.yaml (a run's output_dir, a "
                                  "model folder or a base model with adapter_name_or_path)",
             "export_dir": "give --export_dir OUT, or export_dir in cfg.yaml (a new folder for the merged model)",
             "output_dir": "set output_dir: the folder generated_predictions.jsonl and predict_results.json go to"}


def _cross_checks(flat: dict[str, Any], parsed: dict[str, _Keys]) -> list[str]:
    from ..data.templates import get_template
    from ..errors import ModelError

    problems = []
    model = parsed.get("model")
    if model:
        try:
            get_template(model.template)
        except ModelError as err:
            problems.append(f"template: {err}")
    if model and model.adapter_name_or_path and model.finetuning_type not in (None, "lora", "oft"):
        problems.append(f"adapter_name_or_path needs finetuning_type: lora or oft (it is {model.finetuning_type}); "
                        "set finetuning_type: lora or remove the adapter")
    generation = parsed.get("generation")
    if generation and generation.do_sample and "temperature" in flat and generation.temperature == 0:
        problems.append("do_sample: true with temperature: 0; set temperature > 0 to sample, or do_sample: false")
    if model and generation:  # the commands that generate
        problems.extend(_backend_checks(model, parsed))
    if model and model.quantization_bit:
        problems.extend(_quantization_checks(model, generation is not None))
    return problems


def _quantization_checks(model: ModelKeys, generates: bool) -> list[str]:
    import importlib.util

    if not generates:
        return ["quantization_bit: export merges into the unquantized model (LLaMA-Factory says the same: do not "
                "quantize when merging); remove quantization_bit"]
    problems = []  # (infer_backend: vllm refuses it where it loads, serve/vllm_engine.py)
    if len(model.adapter_name_or_path) > 1:
        problems.append("quantization_bit with several adapters: all but the last are merged, which a quantized "
                        "model cannot take; merge them first (tunesmith export), then chat with the last on that")
    if importlib.util.find_spec("bitsandbytes") is None:
        problems.append("quantization_bit needs bitsandbytes: pip install 'tunesmith[qlora]'")
    return problems


# Per generation backend: the key group only it reads, and the package it needs with how to install it.
_BACKEND_GROUPS = {"vllm": "vllm"}
_BACKEND_PACKAGES = {"vllm": ("vllm", "pip install 'tunesmith[vllm]' (on a machine with a CUDA GPU)")}


def _backend_checks(model: ModelKeys, parsed: dict[str, _Keys]) -> list[str]:
    """A backend's own keys only with that backend, and the backend only where its package is installed."""
    import importlib.util

    problems = []
    for name, group in _BACKEND_GROUPS.items():
        keys = parsed.get(group)
        if keys is not None and name != model.infer_backend:
            problems += [f"'{key}' is read only by infer_backend: {name}; with infer_backend: "
                         f"{model.infer_backend} it changes nothing: set infer_backend: {name} or remove the key"
                         for key in sorted(keys.model_fields_set)]
    package = _BACKEND_PACKAGES.get(model.infer_backend)
    if package and importlib.util.find_spec(package[0]) is None:
        problems.append(f"infer_backend: {model.infer_backend} needs the {package[0]} package, which is not "
                        f"installed: {package[1]}, or use infer_backend: huggingface (transformers generate)")
    return problems


def keys_help(groups: dict[str, type[_Keys]]) -> str:
    """The keys a command reads, by group, for its --help."""
    lines = []
    for name, cls in groups.items():
        lines.append(f"{name} keys:")
        for key, field in cls.model_fields.items():
            default = field.get_default(call_default_factory=True)
            shown = "" if field.is_required() else f" [default: {default}]"
            lines.append(f"  {key:<24} {field.description}{shown}")
    return "\n".join(lines)
