"""Packaging for VSI-PPO: PPO for vision-language agents on VSI-Bench-style spatial questions."""

import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# gymnasium.make("VSI-v0") without importing this package first (a2c_ppo_acktr/gymnasium_plugin.py):
# gymnasium >= 1.0 has no plugin discovery, so site-packages gets a .pth whose line installs an
# import hook that registers the ids when gymnasium is imported.
GYMNASIUM_PTH = ("vsi_ppo_gymnasium.pth", "import a2c_ppo_acktr.gymnasium_plugin\n")


class BuildPyWithGymnasiumHook(build_py):
    """build_py that also writes GYMNASIUM_PTH at the root of what is installed into site-packages:
    the build directory for a wheel, the unpacked editable wheel for ``pip install -e``."""

    def run(self):
        super().run()
        root = self.build_lib
        if getattr(self, "editable_mode", False):  # PEP 660: build_lib is not installed, the wheel root is
            root = self.get_finalized_command("install").install_lib
        name, line = GYMNASIUM_PTH
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            f.write(line)


setup(
    name="vsi-ppo",
    version="0.1.0",
    description="PPO with a value head and learned temperature for VLM agents in 3D indoor scenes (VSI-Bench)",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["a2c_ppo_acktr", "a2c_ppo_acktr.*", "SFT", "SFT.*"]),
    py_modules=["main_vsi", "train_sft", "eval_vsi", "vlm_traj_label", "vlm_traj_preprocess"],
    # Raw scan label -> VSI-Bench category tables (scripts/make_label_maps.py), read via importlib.resources.
    # The tiny builds that ship (a2c_ppo_acktr/tiny/shipped.py): the quickstart copies them instead of building.
    package_data={"a2c_ppo_acktr.envs": ["data/*.tsv"], "a2c_ppo_acktr.tiny": ["shipped/*/*"]},
    install_requires=[
        "torch>=2.4",
        "torchvision>=0.19",
        # Pinned to what the suite runs on (loading.TESTED_VERSIONS checks it at load). transformers 4.x
        # breaks SFT (no activation_checkpointing argument) and fills generate's knobs differently.
        "transformers>=5.24,<6",
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "peft>=0.21,<0.22",
        "accelerate>=1.15,<1.16",
        "gymnasium>=1.0,<2",
        "open3d>=0.18",
        "qwen-vl-utils>=0.0.14",  # video_protocol.py uses its 0.0.14 names (VIDEO_MAX_TOKEN_NUM, MODEL_SEQ_LEN)
        "av>=12",  # PyAV: video decoding for eval_vsi.py --protocol video and scripts/make_mini_vsibench.py
        "wandb>=0.18",
        "tensorboard>=2.15",
        "numpy>=1.24",
        "scipy>=1.11",  # stats.py: Student's t
        "pillow>=10",
        "pyyaml>=6",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "pyarrow>=15",
        "minigrid>=3.0,<4",  # MiniGrid-* env ids (envs/minigrid_text.py); gymnasium-native
    ],
    extras_require={
        # 0.19.x: the engine the CPU-rank tests run (older ones cast rotary inv_freq buffers to bf16).
        "deepspeed": ["deepspeed>=0.19.8,<0.20"],
        # flash-attn must be built against the node's CUDA: `pip install flash-attn --no-build-isolation`.
        "gpu": ["xformers>=0.0.28"],
        "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5,<4", "mutmut>=3.8,<4", "ruff>=0.17,<0.18"],
        # bench/bench_vs_trl.py (TRL's GRPO side by side); 1.16 installs beside the pinned torch/transformers.
        "bench": ["trl>=1.16,<2"],
        # The rollout server (rollout.engine=vllm): return_token_ids needs vLLM >= 0.10.2, and its fields were
        # checked up to 0.33 (a2c_ppo_acktr/common/vllm_compat.py). It runs as its own process (`vllm serve`);
        # nothing in this package imports vllm. Install it where the server runs, in its own environment
        # (VLLM_PYTHON) if its torch pin differs from this one's.
        "vllm": ["vllm>=0.10.2,<0.34"],
    },
    entry_points={
        "console_scripts": [
            "vsi-tiny=a2c_ppo_acktr.tiny.cli:main",
        ],
        # gymnasium 0.26-0.29's plugin group (1.x dropped it; the .pth above does the job there).
        "gymnasium.envs": [
            "vsi_ppo=a2c_ppo_acktr.envs:register_envs",
        ],
    },
    cmdclass={"build_py": BuildPyWithGymnasiumHook},
)
