"""`python -m tunesmith ...` for the tests, without paying the imports each time.

Every training command first spends about 10 s on this CI's CPUs importing torch, transformers, peft and
datasets; the suite runs about two hundred of them. A zygote process imports those once (per test
process), then forks a child per command: the child takes the command's environment, working
folder and arguments, writes its stdout/stderr to files, and runs `tunesmith`'s `__main__` exactly as
`python -m tunesmith` does. What a fresh interpreter shows that a fork cannot (import-time warnings,
which modules a command imports, signals to a process group) is tested with real subprocesses
(`fresh=True`, or Popen in the tests that signal). TUNESMITH_TEST_FRESH_CLI=1 runs every command in a
fresh interpreter.

Multi-process runs (FORCE_TORCHRUN=1) normally start torchrun, whose ranks are fresh interpreters that each pay
the imports again. With TUNESMITH_TEST_FORK_RANKS=1 as well (tests/e2e/test_megatron_cli.py sets it: it tests
the engine over several processes, not the launcher, which test_distributed.py and the fault tests run for real)
the zygote forks the NPROC_PER_NODE ranks itself, each with the environment torchrun gives a rank (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, OMP_NUM_THREADS=1), all writing to the command's
output as torchrun's ranks do; a rank that fails ends the others, as torchrun does. megatron-core is preloaded
when installed, and a `sitecustomize.py` on the command's PYTHONPATH runs in the child as the interpreter would
run it at start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "peft", "datasets", "tunesmith.cli",
            "tunesmith.train.setup", "tunesmith.train.runner")
_PRELOAD_IF_INSTALLED = ("tunesmith.engines.megatron.engine",)


def run_tunesmith(args, *, env: dict | None = None, timeout: float = 300, cwd: Path = REPO,
                  fresh: bool = False) -> subprocess.CompletedProcess:
    """What subprocess.run([python, -m, tunesmith, *args], capture_output=True, text=True) returns."""
    args = [str(a) for a in args]
    full_env = {**os.environ, **(env or {})}
    if fresh or os.environ.get("TUNESMITH_TEST_FRESH_CLI") == "1" or not hasattr(os, "fork"):
        return subprocess.run([sys.executable, "-m", "tunesmith", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env=full_env)
    return _zygote().run(args, full_env, cwd, timeout)


class _Zygote:
    def __init__(self):
        # COLUMNS as cli() gives every command (a console made at import time reads it then)
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the tests' CLI zygote did not start")

    def run(self, args, env, cwd, timeout) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="tunesmith-cli-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"args": args, "env": env, "cwd": str(cwd), "timeout": timeout, "stdout": str(out),
                       "stderr": str(err)}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            reply = json.loads(self.proc.stdout.readline())
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        command = [sys.executable, "-m", "tunesmith", *args]
        if reply.get("timed_out"):
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, reply["returncode"], stdout, stderr)


_ZYGOTE: _Zygote | None = None


def _zygote() -> _Zygote:
    global _ZYGOTE
    if _ZYGOTE is None or _ZYGOTE.proc.poll() is not None:
        _ZYGOTE = _Zygote()
    return _ZYGOTE


# ---- the zygote itself ----------------------------------------------------------------------------------------


def _child(request: dict, set_by_imports: dict, *, rank_env: dict | None = None) -> None:
    """In the forked child: become `python -m tunesmith <args>` (with rank_env: one rank of a torchrun launch,
    appending to the command's output); never returns."""
    import runpy

    code = 1
    try:
        os.setpgid(0, 0)  # its own process group, as the zygote kills it whole on a timeout
        os.chdir(request["cwd"])
        sys.path[:] = _command_path(request["env"].get("PYTHONPATH", ""))  # before the zygote's environment goes
        os.environ.clear()
        os.environ.update({**set_by_imports, **request["env"], **(rank_env or {})})
        mode = os.O_APPEND if rank_env else os.O_TRUNC
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o600)
            os.dup2(target, fd)
            os.close(target)
        if rank_env:
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # read at start-up by a fresh interpreter
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # fd 0 is the zygote's request pipe
        os.close(null)
        sys.stdin, sys.stdout = open(os.devnull), sys.__stdout__  # the zygote had pointed sys.stdout at stderr
        _run_sitecustomize(request["env"].get("PYTHONPATH", ""))
        sys.argv = [sys.executable, *request["args"]]
        try:
            runpy.run_module("tunesmith", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, (int, type(None))):
                print(done.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what an uncaught exception does in python -m
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_sitecustomize(pythonpath: str) -> None:
    """The first sitecustomize.py on the command's PYTHONPATH, run as `site` runs it at an interpreter's start."""
    import runpy

    for entry in filter(None, pythonpath.split(os.pathsep)):
        script = Path(entry) / "sitecustomize.py"
        if script.is_file():
            runpy.run_path(str(script), run_name="sitecustomize")
            return


def _rank_envs(env: dict) -> list[dict] | None:
    """The environments torchrun gives its ranks, where the command asks for forked ranks (module docstring)."""
    if (env.get("TUNESMITH_TEST_FORK_RANKS") != "1" or "LOCAL_RANK" in env
            or env.get("FORCE_TORCHRUN", "0").lower() not in ("1", "true")):
        return None
    world = int(env.get("NPROC_PER_NODE", "1"))
    common = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "ROLE_RANK": "0",
              "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"), "MASTER_PORT": env.get("MASTER_PORT", "29500"),
              "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
    return [{**common, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(world)]


def _command_path(pythonpath: str) -> list[str]:
    """sys.path as `python -m` builds it: the working folder, the command's PYTHONPATH, then the
    interpreter's own entries (not the zygote's script folder nor its PYTHONPATH)."""
    own = {str(Path(__file__).parent)} | set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    wanted = [os.getcwd(), *filter(None, pythonpath.split(os.pathsep))]
    return wanted + [p for p in sys.path if p and p not in own and p not in wanted]


def _wait(pids: list[int], timeout: float) -> dict[int, int] | None:
    """The children's exit statuses (index -> code) once all have ended or one has failed, the rest then killed
    (torchrun's way with its ranks); None when the timeout came first (all killed)."""
    import signal
    import time

    deadline, codes = time.monotonic() + timeout, {}
    while len(codes) < len(pids):
        for i, pid in enumerate(pids):
            if i not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[i] = os.waitstatus_to_exitcode(status)
        failed = any(codes.values())
        if failed or time.monotonic() > deadline:
            for i, pid in enumerate(pids):
                if i not in codes:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    os.waitpid(pid, 0)
            return codes if failed else None
        time.sleep(0.05)
    return codes


def _reply(codes: dict[int, int] | None, ranks: bool, stderr: str) -> dict:
    """The zygote's answer: the exit status, or for forked ranks 0 or 1 with one line naming the failed ranks,
    as launch.relaunch says it."""
    if codes is None:
        return {"timed_out": True}
    if not ranks:
        return {"returncode": codes[0]}
    failed = sorted(rank for rank, code in codes.items() if code != 0)
    if failed:
        with open(stderr, "a") as err:
            err.write(f"tunesmith: training failed on rank(s) {failed}; each rank's message is above\n")
    return {"returncode": 1 if failed else 0}


def _serve() -> None:
    import importlib

    before = dict(os.environ)
    for name in _PRELOAD:
        importlib.import_module(name)
    for name in _PRELOAD_IF_INSTALLED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
    replies = sys.stdout
    sys.stdout = sys.stderr  # nothing a library prints may reach the reply channel
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        ranks = _rank_envs(request["env"])
        if ranks is not None:  # the ranks append to the command's output
            for path in (request["stdout"], request["stderr"]):
                Path(path).write_text("")
        pids = []
        for rank_env in ranks or [None]:
            pid = os.fork()
            if pid == 0:
                _child(request, set_by_imports, rank_env=rank_env)
            pids.append(pid)
        reply = _reply(_wait(pids, request["timeout"]), ranks is not None, request["stderr"])
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
