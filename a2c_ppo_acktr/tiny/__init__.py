"""Offline tiny vision-language models, one sub-package: the build (:mod:`.build`: tokenizer, configs
for five families, the reply-format pre-training, the cached and locked build), the next-token
training both pre-trainings run (:mod:`.training`), and the default build's vision pre-training on
the project's own renders (:mod:`.vision`).

``tiny_model_dir(family, seed)`` is what loading a ``tiny:<family>`` path calls; the command line
(:mod:`.cli`) is ``python -m a2c_ppo_acktr.tiny --family qwen2_5_vl --out DIR [--seed N]`` (or
``vsi-tiny``); the builds that ship with the package are :mod:`.shipped`.
"""

from a2c_ppo_acktr.tiny.build import (  # noqa: F401 (the sub-package's interface)
    BUILDS,
    FAMILIES,
    LLAVA_FAMILIES,
    QWEN_FAMILIES,
    SEED_ENV,
    SPECIAL_TOKENS,
    TINY_VERSION,
    VISION_VARIANTS,
    TinySeedError,
    TinySpec,
    build_tiny_model,
    default_cache_dir,
    default_seed,
    spec_hash,
    tiny_model_dir,
    tiny_spec,
)
