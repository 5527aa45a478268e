"""The boundaries of shared/DESIGN.md, checked on the source: no import cycle, backend libraries and backend
names only in engines/, config/ and data/ independent of the training side, one list of stages."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "tunesmith"
BACKEND_LIBRARIES = ("deepspeed", "megatron", "torch.distributed.fsdp", "torch.distributed.checkpoint",
                     "torch.distributed.tensor", "torch.distributed.pipelining", "vllm")
# The modules outside engines/ that may import a backend library: the vLLM generation backends of serve and
# of online RL's rollouts.
GENERATION_BACKENDS = {"serve/vllm_engine.py": ("vllm",), "rollout/vllm.py": ("vllm",)}
# Modules that may name a backend value: engine selection itself, config resolution, env and estimate.
MAY_NAME_BACKENDS = ("engines/", "config/", "env.py", "estimate.py", "cli.py", "launch.py")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, known: dict) -> set[str]:
    """Every tunesmith module this one imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            submodules = {f"{base}.{a.name}" for a in node.names} & set(known)
            out.update(submodules or {base})  # `from . import x` of a submodule depends on x, not on the package
    return {m for m in out if m.startswith("tunesmith")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(name, path, modules) if m in modules and m != name}
            for name, path in modules.items()}


def test_no_import_cycle():
    graph = _graph()
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _source_files():
    return [(p.relative_to(PACKAGE).as_posix(), p.read_text()) for p in PACKAGE.rglob("*.py")]


def test_backend_libraries_are_imported_only_in_engines():
    offenders = []
    for rel, text in _source_files():
        if rel.startswith("engines/"):
            continue
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{rel}: {n}" for n in names if n.startswith(BACKEND_LIBRARIES)
                          and not n.startswith(GENERATION_BACKENDS.get(rel, ()))]
    assert not offenders, offenders


def test_no_branch_on_the_backend_outside_engines():
    pattern = re.compile(r"""(backend\s*(==|!=|in)|==\s*["'](fsdp2|deepspeed|megatron|single)["'])""")
    offenders = [f"{rel}:{i + 1}: {line.strip()}" for rel, text in _source_files()
                 if not rel.startswith(MAY_NAME_BACKENDS)
                 for i, line in enumerate(text.splitlines()) if pattern.search(line)]
    assert not offenders, offenders


@pytest.mark.parametrize("side,forbidden", [("config", ("engines", "train", "methods")),
                                            ("data", ("engines", "train", "methods"))])
def test_config_and_data_do_not_import_the_training_side(side, forbidden):
    bad = {name: sorted(m for m in deps if m.split(".")[1:2] and m.split(".")[1] in forbidden)
           for name, deps in _graph().items() if name.startswith(f"tunesmith.{side}")}
    assert not {k: v for k, v in bad.items() if v}


def test_methods_never_import_engines():
    bad = {n: d for n, d in _graph().items() if n.startswith("tunesmith.methods") and
           any(m.startswith("tunesmith.engines") for m in d)}
    assert not bad


def test_the_stages_are_listed_once():
    """Only stages.py spells stages out: no other module holds a collection of stage names or compares a
    stage with a name."""
    from tunesmith.stages import STAGE_NAMES

    compare = re.compile(r"""stage\s*(==|!=)\s*["']""")
    offenders = []
    for rel, text in _source_files():
        if rel == "stages.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2:
                values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if len(values) == len(node.elts) and all(v in STAGE_NAMES for v in values):
                    offenders.append(f"{rel}:{node.lineno}: {values}")
        offenders += [f"{rel}:{i + 1}" for i, line in enumerate(text.splitlines()) if compare.search(line)]
    assert not offenders, offenders


def test_config_knows_every_registered_reward():
    from tunesmith.rollout.rewards import REWARDS
    from tunesmith.rollout.rewards.names import BUILTIN_REWARDS

    assert set(REWARDS) == set(BUILTIN_REWARDS)
