"""`python -m tunesmith ...` for the tests, without paying the imports each time.

Every training command first spends about 10 s on this CI's CPUs importing torch, transformers, peft and
datasets; the suite runs about two hundred of them. A zygote process imports those once (per test
process), then forks a child per command: the child takes the command's environment, working
folder and arguments, writes its stdout/stderr to files, and runs `tunesmith`'s `__main__` exactly as
`python -m tunesmith` does. What a fresh interpreter shows that a fork cannot (import-time warnings,
which modules a command imports, signals to a process group) is tested with real subprocesses
(`fresh=True`, or Popen in the tests that signal). TUNESMITH_TEST_FRESH_CLI=1 runs every command in a
fresh interpreter.
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


def _child(request: dict, set_by_imports: dict) -> None:
    """In the forked child: become `python -m tunesmith <args>`; never returns."""
    import runpy

    code = 1
    try:
        os.setpgid(0, 0)  # its own process group, as the zygote kills it whole on a timeout
        os.chdir(request["cwd"])
        sys.path[:] = _command_path(request["env"].get("PYTHONPATH", ""))  # before the zygote's environment goes
        os.environ.clear()
        os.environ.update({**set_by_imports, **request["env"]})
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # fd 0 is the zygote's request pipe
        os.close(null)
        sys.stdin, sys.stdout = open(os.devnull), sys.__stdout__  # the zygote had pointed sys.stdout at stderr
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


def _command_path(pythonpath: str) -> list[str]:
    """sys.path as `python -m` builds it: the working folder, the command's PYTHONPATH, then the
    interpreter's own entries (not the zygote's script folder nor its PYTHONPATH)."""
    own = {str(Path(__file__).parent)} | set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    wanted = [os.getcwd(), *filter(None, pythonpath.split(os.pathsep))]
    return wanted + [p for p in sys.path if p and p not in own and p not in wanted]


def _wait(pid: int, timeout: float) -> dict:
    import signal
    import time

    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status)}
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return {"timed_out": True}
        time.sleep(0.05)


def _serve() -> None:
    import importlib

    before = dict(os.environ)
    for name in _PRELOAD:
        importlib.import_module(name)
    set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
    replies = sys.stdout
    sys.stdout = sys.stderr  # nothing a library prints may reach the reply channel
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, set_by_imports)
        replies.write(json.dumps(_wait(pid, request["timeout"])) + "\n")
        replies.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
