"""`tunesmith <command> [cfg.yaml] [key=value] [--key value]`: parse and dispatch, no logic."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from .errors import ConfigError, TunesmithError, raised_at

USAGE = """usage: tunesmith <command> [options]

commands:
  train   [cfg.yaml] [key=value ...] [--key value ...]   fine-tune a model (see `tunesmith train --help`)
  data    [cfg.yaml] [key=value ...] [--index N]         inspect a dataset: counts, lengths, one rendered sample
  data clean                                             remove the tokenized-data caches
  estimate [cfg.yaml] [key=value ...] [--shape S]        memory per GPU a training config needs; warns if it won't fit
  chat    [cfg.yaml] --model DIR [--prompt TEXT] ...     talk to a trained model (interactive without --prompt)
  export  [cfg.yaml] --model DIR --export_dir OUT        merge LoRA and write a standalone Hugging Face model
  serve   [cfg.yaml] --model DIR [--adapter NAME=DIR]    OpenAI-compatible API server (chat/completions, models)
  score   --model RM --data FILE                         reward-model scores for the records of a file
  eval    [cfg.yaml] --model RM dataset=NAME             pairwise accuracy of a reward model
  bench   --shape qwen3-1.7b [key=value ...]             synthetic throughput benchmark (tokens/s, MFU, memory)
  env                                                    versions, GPUs and usable optional features
  webui   [--host H] [--port P] [--runs_root DIR]        web page: build, launch, watch and compare runs; chat, export

Config keys are LLaMA-Factory's (model_name_or_path, dataset, template, cutoff_len, ...).
Example: tunesmith train examples/quickstart.yaml learning_rate=1e-3
"""


def _setup_logging() -> None:
    from rich.logging import RichHandler

    from .train.progress import console

    level = os.environ.get("TUNESMITH_LOG_LEVEL", "INFO").upper()
    if int(os.environ.get("RANK", "0")) > 0:
        level = "WARNING"  # one rank narrates; the others speak only up
    handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[handler], force=True)
    logging.getLogger("tunesmith").setLevel(level)
    from .quiet import quiet_libraries

    quiet_libraries()


def literal_choices(annotation) -> list | None:
    """The allowed values of a Literal[...] annotation, also inside Optional/Union; None if there is no Literal."""
    import typing

    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    choices = [c for arg in typing.get_args(annotation) for c in (literal_choices(arg) or [])]
    return choices or None


def train_help() -> str:
    from .config.schema import GROUPS

    lines = ["usage: tunesmith train [cfg.yaml] [key=value ...] [--key value ...]", "",
             "Later values win: the YAML file, then key=value / --key value in order.", ""]
    for group, cls in GROUPS.items():
        lines.append(f"{group}:")
        for key, field in cls.model_fields.items():
            default = field.get_default(call_default_factory=True)
            choices = literal_choices(field.annotation)
            allowed = f" [choices: {', '.join(map(str, choices))}]" if choices else ""
            lines.append(f"  {key:<30} {field.description}{allowed} [default: {default}]")
        lines.append("")
    from .infer.options import PredictKeys, keys_help

    lines += ["With do_predict: true the YAML is batch prediction (LLaMA-Factory's nlg_eval; it does not train): its "
              "model, generation, media and vllm keys are `tunesmith chat`'s, and", keys_help({"predict": PredictKeys})]
    return "\n".join(lines)


def _config_from(items: list[str]):
    from .config.load import build_config, parse_cli_items

    yaml_path, overrides = parse_cli_items(items)
    return build_config(yaml_path, overrides)


def cmd_train(items: list[str]) -> int:
    if {"-h", "--help"} & set(items):
        print(train_help())
        return 0
    flat = _flat_keys(items)
    if str(flat.get("do_predict")).lower() in ("true", "1"):  # LF's batch prediction (its nlg_eval YAML)
        from .infer.options import predict_options
        from .infer.predict import run_predict

        run_predict(predict_options(flat))
        return 0
    cfg = _config_from(items)
    from .config.load import train_command_problems

    if problems := train_command_problems(cfg):
        raise ConfigError(problems)
    if cfg.data.tokenized_path and not _tokenized_path_holds_data(cfg.data.tokenized_path):
        _prepared_data(cfg)  # as LLaMA-Factory, a new tokenized_path only prepares the data (saved there)
        logging.getLogger("tunesmith").info("tokenized data saved to %s; train on it by running again with "
                                            "tokenized_path: %s", cfg.data.tokenized_path, cfg.data.tokenized_path)
        return 0
    from .train.setup import train

    result = train(cfg)
    return 130 if result.interrupted else 0


def _tokenized_path_holds_data(path: str) -> bool:
    from .data.pipeline import tokenized_path_holds_data  # only where tokenized_path is set: not on start-up's path

    return tokenized_path_holds_data(path)


def _prepared_data(cfg):
    """(tokenizer, the prepared data) of a config, as training would prepare them."""
    from .data.pipeline import prepare_data
    from .models.load import load_preprocessing

    tokenizer, _, media = load_preprocessing(cfg)
    return tokenizer, prepare_data(cfg, tokenizer, media)


def _pop_flag(items: list[str], flag: str, default):
    """(value of `--flag value`, the other items); `default` when the flag is absent."""
    if flag not in items:
        return default, items
    at = items.index(flag)
    if at + 1 >= len(items):
        raise TunesmithError(f"{flag} needs a value")
    return items[at + 1], items[:at] + items[at + 2 :]


def cmd_data(items: list[str]) -> int:
    if {"-h", "--help"} & set(items):
        print("usage: tunesmith data [cfg.yaml] [key=value ...] [--index N]\n       tunesmith data clean\n\n"
              "Inspect the data a training config would use: counts per dataset, a token-length histogram, and one "
              "rendered sample with its supervised tokens marked (green on a terminal, wrapped in [[ ]] when "
              "piped). Takes the same keys as `tunesmith train`.\n\n"
              "  --index N   which sample to render, default 0")
        return 0
    if items[:1] == ["clean"]:
        from .data.cache import clean, tokenized_root

        count, size = clean()
        print(f"removed {count} cached dataset(s), {size / 1e6:.1f} MB, from {tokenized_root()}")
        return 0
    index, items = _pop_flag(items, "--index", "0")
    index = int(index)
    from .data.inspect import print_inspection
    from .train.progress import console

    tokenizer, data = _prepared_data(_config_from(items))
    print_inspection(console, data, data.report, tokenizer, index)
    return 0


def cmd_estimate(items: list[str]) -> int:
    if {"-h", "--help"} & set(items):
        print("usage: tunesmith estimate [cfg.yaml] [key=value ...] [--shape S] [--gpus N] [--gpu-memory-gib G]\n\n"
              "Memory per GPU a training config needs (weights, gradients, optimizer states, activations, logits), "
              "counted on the meta device without loading weights or data. Takes the same keys as `tunesmith "
              "train`; only the model's config.json is read, so it works offline on a local folder "
              "(model_name_or_path=/path/to/dir) or a named shape. "
              "--shape: a named shape of `tunesmith bench` instead of model_name_or_path (qwen3-0.6b, qwen3-1.7b, "
              "qwen3-4b, qwen3-8b, tiny); "
              "--gpus: GPUs to shard over (default: WORLD_SIZE / NPROC_PER_NODE / visible GPUs); "
              "--gpu-memory-gib: memory per GPU (default: the first GPU's, else 141 for an H200).")
        return 0
    gpus, items = _pop_flag(items, "--gpus", None)
    gpu_gib, items = _pop_flag(items, "--gpu-memory-gib", None)
    shape, items = _pop_flag(items, "--shape", None)
    from .config.load import parse_cli_items
    from .estimate import config_for_estimate, estimate_memory, print_estimate, shape_config
    from .train.progress import console

    cfg = config_for_estimate(*parse_cli_items(items))
    result = estimate_memory(cfg, num_gpus=int(gpus) if gpus is not None else None,
                             gpu_gib=float(gpu_gib) if gpu_gib is not None else None,
                             hf_config=shape_config(shape) if shape is not None else None)
    print_estimate(console, cfg, result, name=f"shape {shape}" if shape is not None else None)
    return 0


def _flat_keys(items: list[str]) -> dict:
    """The YAML file's keys, then the key=value / --key value items."""
    from .config.load import parse_cli_items, read_yaml

    yaml_path, overrides = parse_cli_items(items)
    return {**(read_yaml(yaml_path) if yaml_path else {}), **overrides}


def _parse_infer_argv(parser: argparse.ArgumentParser, argv: list[str], flags: dict[str, str]):
    """(named flags, flat keys): the YAML file, then key=value / --key value items, then the named flags
    (`flags` maps an argparse dest to the key it sets)."""
    args, rest = parser.parse_known_args(argv)
    flat = _flat_keys(rest)
    for dest, key in flags.items():
        if getattr(args, dest) is not None:
            flat[key] = getattr(args, dest)
    return args, flat


def _infer_epilog(groups) -> str:
    from .infer.options import keys_help

    return ("YAML keys (LLaMA-Factory's inference / merge_lora YAMLs work unchanged); also as key=value or "
            "--key value:\n" + keys_help(groups))


def chat_parser() -> argparse.ArgumentParser:
    from .infer.options import CHAT_GROUPS

    parser = argparse.ArgumentParser(
        prog="tunesmith chat", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="tunesmith chat [cfg.yaml] [key=value ...] [--model DIR] [--prompt TEXT] [options]",
        description="Talk to a trained model. cfg.yaml: an inference YAML (llamafactory-cli chat's), e.g. "
        "model_name_or_path + adapter_name_or_path + template.", epilog=_infer_epilog(CHAT_GROUPS))
    parser.add_argument("--model", "--model_name_or_path", dest="model",
                        help="output_dir of a run (full model or LoRA adapter) or a model folder "
                        "(or model_name_or_path in cfg.yaml)")
    parser.add_argument("--prompt", help="answer this one message and exit (default: interactive)")
    parser.add_argument("--system", help="system prompt (default: default_system)")
    parser.add_argument("--max_new_tokens", type=int, help="longest answer in tokens (default: 1024)")
    parser.add_argument("--temperature", type=float, help="0 = greedy (default), >0 samples")
    parser.add_argument("--top_p", type=float, help="nucleus sampling when temperature > 0 (default: 0.7)")
    parser.add_argument("--top_k", type=int, help="keep the k likeliest tokens when temperature > 0 (default: 50)")
    parser.add_argument("--image", action="append", default=[], help="an image for the first message (repeatable)")
    parser.add_argument("--video", action="append", default=[], help="a video for the first message (repeatable)")
    parser.add_argument("--audio", action="append", default=[], help="an audio clip for the first message (repeatable)")
    return parser


_CHAT_FLAGS = {"model": "model_name_or_path", "max_new_tokens": "max_new_tokens", "temperature": "temperature",
               "top_p": "top_p", "top_k": "top_k"}


def cmd_chat(argv: list[str]) -> int:
    args, flat = _parse_infer_argv(chat_parser(), argv, _CHAT_FLAGS)
    from .infer.chat import run_chat
    from .infer.options import chat_options

    run_chat(chat_options(flat), prompt=args.prompt, system=args.system,
             media={"images": args.image, "videos": args.video, "audios": args.audio})
    return 0


def export_parser() -> argparse.ArgumentParser:
    from .infer.options import EXPORT_GROUPS

    parser = argparse.ArgumentParser(
        prog="tunesmith export", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="tunesmith export [cfg.yaml] [key=value ...] [--model DIR] [--export_dir OUT] [options]",
        description="Merge LoRA (if any) and write a standalone Hugging Face model (safetensors). cfg.yaml: a "
        "merge YAML (llamafactory-cli export's): model_name_or_path = the base model, adapter_name_or_path = "
        "the trained LoRA folder, export_dir.", epilog=_infer_epilog(EXPORT_GROUPS))
    parser.add_argument("--model", "--model_name_or_path", dest="model",
                        help="output_dir of a run, or the base model with adapter_name_or_path")
    parser.add_argument("--export_dir", help="new folder for the merged model")
    parser.add_argument("--export_dtype", choices=["bfloat16", "float16", "float32"],
                        help="dtype of the written weights (default: bfloat16)")
    parser.add_argument("--export_size", help="largest safetensors shard, e.g. 5GB or 5 (GB) (default: 5GB)")
    return parser


_EXPORT_FLAGS = {"model": "model_name_or_path", "export_dir": "export_dir", "export_dtype": "export_dtype",
                 "export_size": "export_size"}


def cmd_export(argv: list[str]) -> int:
    _, flat = _parse_infer_argv(export_parser(), argv, _EXPORT_FLAGS)
    from .infer.export import export_model
    from .infer.options import export_options

    opts = export_options(flat)
    m, e = opts.model, opts.export
    dtype = e.export_dtype or (m.infer_dtype if m.infer_dtype != "auto" else "bfloat16")
    out = export_model(m.model_name_or_path, e.export_dir, dtype=dtype, max_shard_size=e.max_shard_size,
                       adapters=m.adapter_name_or_path, device=e.export_device, template=m.template,
                       trust_remote_code=m.trust_remote_code, cache_dir=m.cache_dir, revision=m.model_revision)
    print(f"exported to {out}")
    return 0


def serve_parser() -> argparse.ArgumentParser:
    from .infer.options import SERVE_GROUPS

    parser = argparse.ArgumentParser(
        prog="tunesmith serve", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="tunesmith serve [cfg.yaml] [key=value ...] [--model DIR] [--adapter NAME=DIR ...] [--host H] "
        "[--port P]",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/models, /v1/chat/completions, "
        "/v1/completions). cfg.yaml: an inference YAML (llamafactory-cli api's). Listens on 127.0.0.1:8000 "
        "unless --host/--port or API_HOST/API_PORT say otherwise; another address needs API_KEY. See "
        "docs/serving.md.", epilog=_infer_epilog(SERVE_GROUPS))
    parser.add_argument("--model", "--model_name_or_path", dest="model",
                        help="output_dir of a run (full model or LoRA adapter), a model folder or hub id "
                        "(or model_name_or_path in cfg.yaml)")
    parser.add_argument("--adapter", action="append",
                        help="NAME=DIR: a LoRA adapter of the same base served beside it as model NAME "
                        "(repeatable; sets lora_modules)")
    parser.add_argument("--host", help="address to bind (default: API_HOST, else 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, help="port to listen on (default: API_PORT, else 8000)")
    return parser


_SERVE_FLAGS = {"model": "model_name_or_path", "adapter": "lora_modules", "host": "host", "port": "port"}


def cmd_serve(argv: list[str]) -> int:
    _, flat = _parse_infer_argv(serve_parser(), argv, _SERVE_FLAGS)
    from .infer.options import serve_options
    from .serve.server import serve

    serve(serve_options(flat))
    return 0


def score_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunesmith score", description="Score records with a reward model.")
    parser.add_argument("--model", required=True, help="output_dir of a `stage: rm` run")
    parser.add_argument("--data", required=True, help="JSON/JSONL records: messages, or prompt + response")
    parser.add_argument("--output", help="where to write the scored JSONL (default: DATA.scored.jsonl)")
    parser.add_argument("--batch_size", type=int, default=8, help="records scored per forward (default: 8)")
    return parser


def cmd_score(argv: list[str]) -> int:
    args = score_parser().parse_args(argv)
    from .infer.reward import score_file

    print(f"wrote {score_file(args.model, args.data, args.output, args.batch_size)}")
    return 0


EVAL_USAGE = """usage: tunesmith eval [cfg.yaml] [--model RM] [dataset=NAME] [dataset_dir=...] [max_samples=N] [key=value ...]

Pairwise accuracy (ties count as wrong) and mean rewards of a reward model (the output_dir of a `stage: rm`
run) on the pairs of a preference dataset. cfg.yaml / key=value: model_name_or_path (the reward model, or its
base with adapter_name_or_path = a LoRA reward model), dataset (or eval_dataset), dataset_dir, max_samples,
template, cutoff_len and the other data keys of `tunesmith train`; batch_size = pairs per forward (default 8).
--model RM sets model_name_or_path.

LLaMA-Factory's `llamafactory-cli eval` (MMLU / C-Eval / CMMLU benchmarks: task, n_shot, lang, save_dir) is not
available: its keys are refused. Run a benchmark harness (e.g. lm-evaluation-harness) on an exported model."""


def cmd_eval(items: list[str]) -> int:
    if {"-h", "--help"} & set(items):
        print(EVAL_USAGE)
        return 0
    model, rest = _pop_flag(items, "--model", None)
    from .infer.reward import eval_config, pairwise_accuracy

    flat = _flat_keys(rest)
    if model is not None:
        flat["model_name_or_path"] = model
    if "model_name_or_path" not in flat:
        print(EVAL_USAGE)
        return 2
    cfg, batch_size = eval_config(flat)
    for key, value in pairwise_accuracy(cfg.model.model_name_or_path, cfg, batch_size).items():
        print(f"{key:<16} {value:.4f}" if isinstance(value, float) else f"{key:<16} {value}")
    return 0


def cmd_bench(items: list[str]) -> int:
    if {"-h", "--help"} & set(items):
        from . import bench

        print(bench.__doc__)
        return 0
    options = {"--shape": "qwen3-1.7b", "--num_samples": "1000", "--min_len": "200", "--max_len": "2000"}
    hf_baseline = "--hf_baseline" in items
    items = [i for i in items if i != "--hf_baseline"]
    for flag in options:
        options[flag], items = _pop_flag(items, flag, options[flag])
    from .bench import run
    from .config.load import parse_cli_items

    _, overrides = parse_cli_items(items)
    result = run(options["--shape"], int(options["--num_samples"]), int(options["--min_len"]),
                 int(options["--max_len"]), overrides, hf_baseline)
    from . import dist

    if dist.is_main():
        print("RESULT " + json.dumps(result))
    return 0


def cmd_env(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print("usage: tunesmith env\n\n"
              "Print the Python, platform and core library versions, the CUDA version and visible GPUs, bf16 "
              "support, and which optional packages are installed with the features they enable.")
        return 0
    from .env import collect

    for key, value in collect().items():
        print(f"{key:<16} {value}")
    return 0


def webui_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunesmith webui", allow_abbrev=False,
        description="A web page to build a training config from a form (LLaMA-Factory YAML import and export), "
        "launch runs, watch their curves live, compare runs, chat with a checkpoint and export it. Local by "
        "default; bound to any other address it requires a token. See docs/webui.md.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: 127.0.0.1, this machine only; another address needs a token)")
    parser.add_argument("--port", type=int, default=7860, help="port to listen on (default: 7860)")
    parser.add_argument("--runs_root", default="saves",
                        help="folder whose runs are shown and where launched runs train (default: ./saves)")
    parser.add_argument("--token", help="access token every request must carry (default: TUNESMITH_WEBUI_TOKEN, "
                        "else generated and printed when the host is not a loopback address)")
    return parser


def cmd_webui(argv: list[str]) -> int:
    args = webui_parser().parse_args(argv)
    from .webui.server import run_webui

    return run_webui(args.host, args.port, args.runs_root, args.token)


COMMANDS = {"train": cmd_train, "data": cmd_data, "chat": cmd_chat, "export": cmd_export, "env": cmd_env,
            "score": cmd_score, "eval": cmd_eval, "bench": cmd_bench,
            "estimate": cmd_estimate, "webui": cmd_webui, "serve": cmd_serve}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] not in COMMANDS:
        print(f"tunesmith: unknown command '{argv[0]}'\n\n{USAGE}", file=sys.stderr)
        return 2
    from . import import_memo

    import_memo.install()  # before the libraries' imports: they repeat work that a file on disk remembers
    if argv[0] in ("train", "bench") and not {"-h", "--help"} & set(argv):
        from .launch import relaunch, wants_torchrun

        if wants_torchrun():
            return relaunch(argv)
    if argv[0] == "train":
        from . import collector, prefetch

        collector.pause()  # until set-up is done (collector.py)
        prefetch.start()
    _setup_logging()
    finished = False
    try:
        code = COMMANDS[argv[0]](argv[1:])
        finished = code == 0
        return code
    except TunesmithError as err:
        logging.getLogger("tunesmith").error("%s%s", _rank_prefix(), err)
        return 1
    except Exception as err:
        if "RANK" not in os.environ:
            raise
        # Under torchrun each failing rank says what failed once, with its rank, and exits.
        logging.getLogger("tunesmith").error("%s%s: %s%s", _rank_prefix(), type(err).__name__, err, raised_at(err))
        return 1
    finally:
        from . import collector, dist

        collector.release()
        dist.shutdown(finished)


def _rank_prefix() -> str:
    return f"rank {os.environ['RANK']}: " if "RANK" in os.environ else ""


def run() -> None:
    """The `tunesmith` command: main(), then, after a training run that finished, exit_quickly (a failed one takes
    the usual way out: under torchrun a quick exit of one rank could end the others before they report)."""
    argv = sys.argv[1:]
    try:
        code = main(argv)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`tunesmith train --help | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's own flush is quiet too
        sys.exit(1)
    if argv[:1] == ["train"] and code == 0:
        exit_quickly(code)
    sys.exit(code)


def exit_quickly(code: int) -> None:
    """End the process as the interpreter would (non-daemon threads joined, atexit handlers run, streams flushed)
    but without its teardown of every module and object, torch's and CUDA's included: that takes 1-1.5 s after a
    training run and frees nothing the operating system does not free when the process ends."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a closed stream: as the interpreter, carry on
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
