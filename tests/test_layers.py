"""The import rule of docs/CONTRACTS.md ("Layers"): every module imports only from its own layer or
lower ones (lazy imports included), and no modules import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from a2c_ppo_acktr.common import errors

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "a2c_ppo_acktr"

# module (or package prefix ending in ".*") -> layer, as docs/CONTRACTS.md lists them
LAYERS: dict[str, int] = {
    **dict.fromkeys(
        [
            "common",
            "common.choices",
            "common.errors",
            "common.atomic",
            "common.digest",
            "common.jsonl",
            "common.bounded_read",
            "common.redaction",
            "common.safe_paths",
            "common.stats",
            "common.scoring",
            "common.env_ids",
            "common.entry_points",
            "common.vllm_compat",
            "run",
            "run.preemption",
        ],
        0,
    ),
    **dict.fromkeys(
        [
            "config",
            "config.arguments",
            "config.cli",
            "common.prompts",
            "common.sameness",
            "run.rundir",
            "run.checkpoint",
            "run.distributed",
            "run.logger",
        ],
        1,
    ),
    "envs.*": 2,
    **dict.fromkeys(["policy.*", "tiny", "tiny.*"], 3),
    **dict.fromkeys(["algo", "algo.*"], 4),
    **dict.fromkeys(["reports.*", "eval.*", "labels.*"], 5),
    **dict.fromkeys(["rl", "rl.*"], 6),
    **dict.fromkeys(
        [
            "export",
            "prefetch",
            "memory",
            "real_size",
            "real_size_probe",
            "rollout_servers",
            "vision_probe",
            "gpu_smoke",
            "gymnasium_plugin",
        ],
        7,
    ),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path  # "" is the package itself
    return out


MODULES = _modules()


def layer_of(name: str) -> int:
    if name in LAYERS:
        return LAYERS[name]
    for key, layer in LAYERS.items():
        if key.endswith(".*") and (name == key[:-2] or name.startswith(key[:-1])):
            return layer
    raise KeyError(f"a2c_ppo_acktr.{name} has no layer: add it to LAYERS here and to docs/CONTRACTS.md")


def imports_of(name: str, source: str | None = None) -> set[str]:
    """The package modules ``name`` imports, anywhere in the file (lazy imports too); ``source``
    stands in for the file's text."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
                stem = "a2c_ppo_acktr" + ("." + stem if stem else "")
            else:
                stem = node.module or ""
            targets = [f"{stem}.{a.name}" for a in node.names] + [stem]
        else:
            continue
        for t in targets:
            if t != "a2c_ppo_acktr" and not t.startswith("a2c_ppo_acktr."):
                continue
            mod = t[len("a2c_ppo_acktr.") :] if t != "a2c_ppo_acktr" else ""
            while mod and mod not in MODULES:
                mod = mod.rpartition(".")[0]
            if mod and mod != name:
                found.add(mod)
    return found


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if m and not _has_layer(m)]
    assert not missing, f"modules without a layer (add them to LAYERS and docs/CONTRACTS.md): {missing}"


def _has_layer(name: str) -> bool:
    try:
        layer_of(name)
    except KeyError:
        return False
    return True


def test_no_module_imports_from_a_layer_above_it():
    upward = sorted(
        f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
        for m in MODULES
        if m
        for t in imports_of(m)
        if layer_of(t) > layer_of(m)
    )
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_import_cycle():
    graph = {m: imports_of(m) for m in MODULES if m}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"modules that import each other: {cycles}"


def test_the_checker_sees_lazy_and_relative_imports():
    # tiny.vision renders NumberLine frames inside a function (a lazy import)
    assert "envs.cards.numberline" in imports_of("tiny.vision")
    assert {"config.arguments", "envs.registry"} <= imports_of("envs.batch")
    # the package imports absolutely; a relative import resolves from the module's own package
    relative = "from ..config.arguments import RunConfig\nfrom .registry import make_env\nfrom . import scene\n"
    assert imports_of("envs.batch", relative) == {"config.arguments", "envs.registry", "envs.scene", "envs"}
    with pytest.raises(KeyError, match="has no layer"):
        layer_of("no_such_module")


@pytest.mark.parametrize(
    "name",
    [
        "config.arguments.ConfigError",
        "run.checkpoint.CheckpointError",
        "common.jsonl.JsonlError",
        "policy.loading.ModelLoadError",
        "policy.loading.ContextLengthError",
        "envs.real_scans.SceneLoadError",
        "envs.vsibench.VSIBenchRowError",
        "policy.rollout_engine.EngineError",
    ],
)
def test_every_user_error_carries_the_marker(name):
    import importlib

    module, _, cls = name.rpartition(".")
    assert issubclass(getattr(importlib.import_module(f"a2c_ppo_acktr.{module}"), cls), errors.UserError)
