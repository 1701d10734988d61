"""Plain helpers that several test files share (fixtures live in ``conftest.py``).

Imported by name, ``from helpers import ...`` (pytest puts ``tests/`` on ``sys.path``): no test file
imports another test file. The package's modules are imported inside the functions that use them,
so a test file that needs only :func:`free_port` does not load the model code.
"""

from __future__ import annotations

import copy
import json
import math
import socket
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn


# ------------------------------------------------------------------------------ processes
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for torchrun, accelerate, servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ the tiny VLM policy
# The rollout layout of test_policy.py, shared by the tests that act and update on the tiny VLM.
NUM_ENVS, NUM_STEPS = 3, 2


def tiny_model_cfg(path, **over):
    """A ModelConfig on CPU with small heads and LoRA for the tiny model at ``path`` (``over`` wins)."""
    from a2c_ppo_acktr.config.arguments import ModelConfig

    base = dict(
        model_path=path,
        device="cpu",
        max_new_tokens=10,
        value_head_hidden=16,
        temp_head_hidden=8,
        lora_r=4,
        lora_alpha=8,
    )
    return ModelConfig(**{**base, **over})


def fresh_policy(loaded, path, **over):
    """A VLMPolicy on a deep copy of ``loaded``'s model, config ``tiny_model_cfg(path, **over)``."""
    from a2c_ppo_acktr.policy.loading import LoadedVLM
    from a2c_ppo_acktr.policy.model import VLMPolicy

    fresh = LoadedVLM(
        model=copy.deepcopy(loaded.model), processor=loaded.processor, family=loaded.family, path=loaded.path
    )
    torch.manual_seed(0)  # same head and LoRA initialisation for every fresh policy
    return VLMPolicy(tiny_model_cfg(path, **over), fresh)


QUESTIONS = (
    "How many chairs are in the room?",
    "What is the distance between the bed and the sofa in meters?",
    "Which is closer?",
)


def observation_rows(rng, texts, frames_per_row, shape=lambda k: (28 + 8 * k, 36)) -> list[dict]:
    """Observations ``{"images": [...], "text": ...}``: row i holds ``texts[i]`` and
    ``frames_per_row[i]`` random RGB frames, frame k of a row ``shape(k)`` (height, width) pixels
    (by default of different sizes), drawn from ``rng`` row by row."""
    return [
        {"images": [rng.integers(0, 256, (*shape(k), 3), dtype=np.uint8) for k in range(frames)], "text": text}
        for text, frames in zip(texts, frames_per_row)
    ]


def policy_observations(rng, step):
    """Unequal prompt lengths and image counts (1-3 images of different sizes) per env."""
    texts = [QUESTIONS[n] + " turn " * (step + n) for n in range(NUM_ENVS)]
    return observation_rows(rng, texts, [1 + (n + step) % 3 for n in range(NUM_ENVS)])


def policy_rollout(policy, seed=0):
    """NUM_STEPS steps of NUM_ENVS envs acted by ``policy`` on :func:`policy_observations`."""
    from a2c_ppo_acktr.algo.storage import RolloutStorage

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    st = RolloutStorage(NUM_STEPS, NUM_ENVS)
    for t in range(NUM_STEPS):
        act = policy.act(policy_observations(rng, t))
        st.insert(act, torch.linspace(-1, 1, NUM_ENVS), torch.tensor([False, t == 1, False]), torch.zeros(NUM_ENVS))
    st.compute_returns(policy.get_values(policy_observations(rng, NUM_STEPS)))
    return st


def split_state(policy):
    """Copies of ``policy``'s parameters as (frozen, lora, heads) dicts by name."""
    frozen, lora, heads = {}, {}, {}
    for name, p in policy.named_parameters():
        t = p.detach().clone()
        if "lora_" in name:
            lora[name] = t
        elif name.startswith(("value_head", "temp_predictor")):
            heads[name] = t
        else:
            frozen[name] = t
    return frozen, lora, heads


# ------------------------------------------------------------------------------ SFT rows
def sft_observation(
    rng: np.random.Generator, n_images: int, question: str = "How many chair(s) are in this room?"
) -> dict:
    """An observation with ``n_images`` random 32x32 images and the RL prompt's text."""
    from a2c_ppo_acktr.common.prompts import observation_text

    images = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(n_images)]
    text = observation_text(question, None, "none yet (this is the start).", 3, num_sweep_frames=n_images)
    return {"images": images, "text": text}


def write_sft_rows(tmp_path: Path, rows: list[tuple[dict, str]]) -> Path:
    """Rows of (observation, response) as an SFT JSONL with PNG images beside it."""
    from PIL import Image

    from a2c_ppo_acktr.common.prompts import assistant_message, build_messages

    (tmp_path / "img").mkdir(exist_ok=True)
    path = tmp_path / "train.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, (obs, resp) in enumerate(rows):
            paths = []
            for j, img in enumerate(obs["images"]):
                rel = f"img/{i}_{j}.png"
                Image.fromarray(img).save(tmp_path / rel)
                paths.append(rel)
            f.write(json.dumps({"messages": build_messages(obs) + [assistant_message(resp)], "images": paths}) + "\n")
    return path


# ------------------------------------------------------------------------------ PPO on a toy tensor policy
def one_token_output(log_probs, values, entropy, kl=None, **extra):
    """A policy output for turns of one generated token each: the per-token tensors ``(B, 1)`` are
    the per-turn ones (so every ratio level and aggregation reads the same numbers)."""
    return SimpleNamespace(
        log_probs=log_probs,
        values=values,
        entropy=entropy,
        kl=kl,
        token_log_probs=log_probs[:, None],
        token_mask=torch.ones(log_probs.shape[0], 1, dtype=torch.bool),
        token_entropy=entropy[:, None],
        token_kl=None if kl is None else kl[:, None],
        **extra,
    )


class ToyPolicy(nn.Module):
    """One logit and one value per stored turn; the KL to the reference is theta^2."""

    has_reference = True

    def __init__(self, n: int) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(n))
        self.v = nn.Parameter(torch.zeros(n))
        self.calls = []
        self.seen = []  # (log_probs, old_log_probs) of every forward, to recount the KL independently

    def forward(self, mb, with_kl=False):
        self.calls.append(with_kl)
        th = self.theta[mb.indices]
        log_probs = nn.functional.logsigmoid(th)
        self.seen.append((log_probs.detach().clone(), mb.old_log_probs.clone()))
        return one_token_output(log_probs, self.v[mb.indices], torch.zeros_like(th), th**2 if with_kl else None)


def toy_storage(T=2, N=4, seed=0):
    """A RolloutStorage of T x N turns with empty prompts, stored log-prob log(0.5) and random rewards."""
    from a2c_ppo_acktr.algo.storage import RolloutStorage

    g = torch.Generator().manual_seed(seed)
    st = RolloutStorage(T, N)
    for t in range(T):
        act = SimpleNamespace(
            texts=[""] * N,
            prompts=[""] * N,
            images=[[] for _ in range(N)],
            prompt_ids=[torch.zeros(1)] * N,
            generated_ids=[torch.zeros(1)] * N,
            token_weights=[torch.ones(1)] * N,
            log_probs=torch.full((N,), math.log(0.5)),
            values=torch.zeros(N),
            temperatures=torch.ones(N),
            token_log_probs=[torch.full((1,), math.log(0.5))] * N,
        )
        st.insert(act, torch.randn(N, generator=g), torch.zeros(N), torch.zeros(N))
    st.compute_returns(torch.zeros(N))
    return st


def toy_ppo(policy, lr=0.1, **over):
    """PPO with plain SGD at ``lr``: 2 epochs of minibatches of 2 unless ``over`` says otherwise."""
    from a2c_ppo_acktr.algo.ppo import PPO
    from a2c_ppo_acktr.config.arguments import PPOConfig

    # The toy storages hold fixed old log-probs that the tests' expectations start from: the update
    # takes them as they are (ppo.old_log_probs=rollout) unless a test asks for the recompute.
    cfg = PPOConfig(
        **{"ppo_epochs": 2, "mini_batch_size": 2, "lr": lr, "max_grad_norm": 10.0, "old_log_probs": "rollout", **over}
    )
    return PPO(policy, torch.optim.SGD(policy.parameters(), lr=lr), cfg, seed=0)


def toy_minibatch(old_log_probs, old_values, advantages, returns):
    """A Minibatch of B turns holding only the numbers the losses read."""
    from a2c_ppo_acktr.algo.storage import Minibatch

    B = len(advantages)

    def t(x):
        return torch.tensor(x, dtype=torch.float32)

    return Minibatch(
        prompts=[""] * B,
        images=[[] for _ in range(B)],
        prompt_ids=[torch.zeros(1)] * B,
        generated_ids=[torch.zeros(1)] * B,
        token_weights=[torch.ones(1)] * B,
        old_log_probs=t(old_log_probs),
        old_values=t(old_values),
        advantages=t(advantages),
        returns=t(returns),
        indices=torch.arange(B),
        old_token_log_probs=[t([x]) for x in old_log_probs],
    )


# ------------------------------------------------------------------------------ tokenizers
class PieceTokenizer:
    """Each id decodes to a fixed piece; ids in ``special`` decode to nothing (skip_special_tokens)."""

    def __init__(self, pieces, special=()):
        self.pieces, self.special = pieces, set(special)

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if (i in self.special and skip_special_tokens) else self.pieces[i] for i in ids)

    def batch_decode(self, batch, skip_special_tokens=True):
        return [self.decode(ids, skip_special_tokens) for ids in batch]


# ------------------------------------------------------------------------------ scans on disk
def write_arkit_scan(root: Path, video_id: str, scene) -> None:
    """Write ``scene`` as an ARKitScenes 3DOD directory: ASCII PLY mesh and annotation JSON."""
    d = root / video_id
    d.mkdir(parents=True)
    v, t = scene.vertices, scene.triangles
    # Per-vertex colors: each vertex takes the color of (one of) its triangles.
    colors = np.zeros((len(v), 3))
    colors[t.reshape(-1)] = np.repeat(scene.triangle_colors, 3, axis=0)
    head = [
        "ply",
        "format ascii 1.0",
        f"element vertex {len(v)}",
        "property float x",
        "property float y",
        "property float z",
        "property uchar red",
        "property uchar green",
        "property uchar blue",
        f"element face {len(t)}",
        "property list uchar int vertex_indices",
        "end_header",
    ]
    body = [f"{p[0]} {p[1]} {p[2]} {int(c[0] * 255)} {int(c[1] * 255)} {int(c[2] * 255)}" for p, c in zip(v, colors)]
    body += [f"3 {a} {b} {c}" for a, b, c in t]
    (d / f"{video_id}_3dod_mesh.ply").write_text("\n".join(head + body) + "\n")
    data = [
        {
            "label": o.label,
            "segments": {
                "obbAligned": {
                    "centroid": o.center.tolist(),
                    "axesLengths": o.extent.tolist(),
                    "normalizedAxes": o.rotation.T.reshape(-1).tolist(),
                }
            },
        }
        for o in scene.objects
    ]
    (d / f"{video_id}_3dod_annotation.json").write_text(json.dumps({"data": data}))


def _write_binary_ply(path: Path, vertices, triangles, colors) -> None:
    """A binary little-endian PLY triangle mesh with uchar vertex colors (colors in [0, 1])."""
    vdt = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1")])
    va = np.zeros(len(vertices), vdt)
    va["x"], va["y"], va["z"] = np.asarray(vertices, dtype=np.float64).T
    va["r"], va["g"], va["b"] = (np.clip(np.asarray(colors), 0, 1) * 255).astype(np.uint8).T
    fdt = np.dtype([("n", "u1"), ("i", "<i4", (3,))])
    fa = np.zeros(len(triangles), fdt)
    fa["n"], fa["i"] = 3, triangles
    head = [
        "ply",
        "format binary_little_endian 1.0",
        f"element vertex {len(vertices)}",
        "property float x",
        "property float y",
        "property float z",
        "property uchar red",
        "property uchar green",
        "property uchar blue",
        f"element face {len(triangles)}",
        "property list uchar int vertex_indices",
        "end_header",
    ]
    path.write_bytes(("\n".join(head) + "\n").encode() + va.tobytes() + fa.tobytes())


def _unshared(scene):
    """One vertex per triangle corner (so each vertex has its triangle's object and color), their
    faces, and the per-vertex object ids."""
    corners = scene.vertices[scene.triangles].reshape(-1, 3)
    faces = np.arange(len(corners)).reshape(-1, 3)
    return corners, faces, np.repeat(scene.triangle_colors, 3, axis=0), np.repeat(scene.triangle_object_ids, 3)


def write_scannet_scan(root: Path, name: str, scene) -> Path:
    """Write ``scene`` as a ScanNet scan directory ``root/name`` (identity axis alignment; one segment
    per object, segment 0 the structure, labelled wall)."""
    d = root / name
    d.mkdir(parents=True)
    v, f, c, ids = _unshared(scene)
    _write_binary_ply(d / f"{name}_vh_clean_2.ply", v, f, c)
    (d / f"{name}_vh_clean_2.0.010000.segs.json").write_text(
        json.dumps({"sceneId": name, "segIndices": (ids + 1).tolist()})
    )
    groups = [{"id": 0, "objectId": 0, "label": "wall", "segments": [0]}]
    groups += [
        {"id": o.object_id + 1, "objectId": o.object_id + 1, "label": o.label, "segments": [o.object_id + 1]}
        for o in scene.objects
    ]
    (d / f"{name}.aggregation.json").write_text(json.dumps({"sceneId": name, "segGroups": groups}))
    (d / f"{name}.txt").write_text("axisAlignment = " + " ".join(str(x) for x in np.eye(4).ravel()) + "\n")
    return d


def write_scannetpp_scan(root: Path, scene_id: str, scene) -> Path:
    """Write ``scene`` as a ScanNet++ scene ``root/scene_id/scans/`` (mesh_aligned_0.05.ply,
    segments.json, segments_anno.json with each object's obb; segment 0 the structure, a wall)."""
    d = root / scene_id / "scans"
    d.mkdir(parents=True)
    v, f, c, ids = _unshared(scene)
    _write_binary_ply(d / "mesh_aligned_0.05.ply", v, f, c)
    (d / "segments.json").write_text(json.dumps({"sceneId": scene_id, "segIndices": (ids + 1).tolist()}))
    groups = [{"id": 0, "objectId": 0, "label": "wall", "segments": [0]}]
    groups += [
        {
            "id": o.object_id + 1,
            "objectId": o.object_id + 1,
            "label": o.label,
            "segments": [o.object_id + 1],
            "obb": {
                "centroid": o.center.tolist(),
                "axesLengths": o.extent.tolist(),
                "normalizedAxes": o.rotation.T.reshape(-1).tolist(),
            },
        }
        for o in scene.objects
    ]
    (d / "segments_anno.json").write_text(json.dumps({"sceneId": scene_id, "segGroups": groups}))
    return root / scene_id


def mini_vsibench_module():
    """``scripts/make_mini_vsibench.py`` imported as a module (it is a script, not a package module)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "make_mini_vsibench.py"
    spec = importlib.util.spec_from_file_location("make_mini_vsibench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_line_error(capsys, rc: int, *fragments: str) -> str:
    """The one ``...: error: ...`` line a command printed on stderr (progress bars and warnings aside),
    after asserting exit code 2, no traceback, exactly one such line, and each fragment in it."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], err
    return lines[0]


def perturbed_checkpoint(root: Path, cfg, scale: float = 0.2, step: int = 1):
    """``(checkpoint dir, policy)``: a run checkpoint under ``root`` of a fresh policy of ``cfg`` (a
    RunConfig) whose trainable weights are moved off their start by ``scale`` x N(0, 1), a stand-in
    for training (LoRA B starts at zero, so this makes the adapter matter)."""
    from a2c_ppo_acktr.policy.model import VLMPolicy

    torch.manual_seed(0)
    trained = VLMPolicy(cfg.model)
    with torch.no_grad():
        for p in trained.trainable_parameters():
            p.add_(scale * torch.randn_like(p))
    ckpt = Path(root) / "run" / "checkpoints" / f"checkpoint-{step:06d}"
    trained.save_pretrained(ckpt / "policy")
    cfg.save(ckpt / "config.yaml")
    return ckpt, trained


def run_overrides(out, defaults: dict, extra: dict) -> list[str]:
    """``section.key=value`` overrides of a training run writing to ``out``, quiet (no progress bar,
    no tensorboard), then a test module's ``defaults``, then the call's ``extra``."""
    merged = {"log.output_dir": str(out), "log.progress_bar": "false", "log.tensorboard": "false", **defaults, **extra}
    return [f"{k}={v}" for k, v in merged.items()]
