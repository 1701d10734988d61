"""Surface materials of the shaded look: a name per material, and its procedural texture.

Every triangle of a :class:`~a2c_ppo_acktr.envs.scene.Scene` carries a material id
(``Scene.triangle_materials``, an index into :data:`MATERIALS`). The renderer's ``shaded`` look
multiplies the triangle's base color by the material's texture, looked up from the hit point itself
(triplanar: the two world axes across the triangle's dominant normal axis), so wood grain, fabric
weave, floor tiles or parquet planks stay fixed on the surface while the camera moves.

A texture is a tile of ``TEXTURE_SIZE x TEXTURE_SIZE`` brightness factors (mean about 1) covering
``period`` meters on each side and repeated; the tiles are computed once, deterministically (no global
random state), by :func:`texture_tiles`. Material ``plain`` (id 0) has no texture and is what scenes
without materials get; ``scan`` marks real-scan triangles whose vertex colors already carry texture.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

TEXTURE_SIZE = 64  # texels per tile side; a power of two so that wrapping is a bit mask


@dataclass(frozen=True)
class Material:
    """A surface material.

    Attributes:
        name: Registry name used by mesh builders (``"wood"``).
        pattern: Texture generator: ``none``, ``grain``, ``planks``, ``tiles``, ``weave``, ``speckle``,
            ``brushed``, ``leaves``, ``knit``.
        period: Side of one texture tile in meters.
        contrast: Amplitude of the brightness variation (0 = no texture).
    """

    name: str
    pattern: str
    period: float
    contrast: float


MATERIALS: tuple[Material, ...] = (
    Material("plain", "none", 1.0, 0.0),
    Material("scan", "none", 1.0, 0.0),
    Material("paint", "speckle", 0.5, 0.03),  # walls
    Material("ceiling", "speckle", 0.5, 0.02),
    Material("parquet", "planks", 1.6, 0.22),  # floors
    Material("floor_tiles", "tiles", 0.6, 0.30),  # kitchen and bathroom floors
    Material("carpet", "speckle", 0.25, 0.12),
    Material("wall_tiles", "tiles", 0.3, 0.25),
    Material("wood", "grain", 0.8, 0.22),
    Material("dark_wood", "grain", 0.8, 0.18),
    Material("fabric", "weave", 0.08, 0.14),
    Material("leather", "speckle", 0.3, 0.08),
    Material("knit", "knit", 0.2, 0.12),  # pillows, blankets
    Material("metal", "brushed", 0.4, 0.10),
    Material("plastic", "none", 1.0, 0.0),
    Material("ceramic", "none", 1.0, 0.0),
    Material("glass", "none", 1.0, 0.0),
    Material("screen", "none", 1.0, 0.0),
    Material("paper", "speckle", 0.2, 0.05),
    Material("foliage", "leaves", 0.35, 0.45),
    Material("soil", "speckle", 0.1, 0.25),
)

MATERIAL_IDS: dict[str, int] = {m.name: i for i, m in enumerate(MATERIALS)}


def material_id(name: str) -> int:
    """Id of a material by name; raises ``KeyError`` listing the known names."""
    try:
        return MATERIAL_IDS[name]
    except KeyError:
        raise KeyError(f"unknown material {name!r}; known: {sorted(MATERIAL_IDS)}") from None


def _value_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Smooth periodic noise (size, size) in [0, 1]: bilinear interpolation of a cells x cells grid."""
    grid = rng.random((cells, cells))
    coords = np.arange(size) * cells / size
    i0 = np.floor(coords).astype(int)
    f = coords - i0
    f = f * f * (3 - 2 * f)  # smoothstep, no visible grid lines
    i1 = (i0 + 1) % cells
    rows0 = grid[i0][:, i0] * (1 - f)[None, :] + grid[i0][:, i1] * f[None, :]
    rows1 = grid[i1][:, i0] * (1 - f)[None, :] + grid[i1][:, i1] * f[None, :]
    return rows0 * (1 - f)[:, None] + rows1 * f[:, None]


def _pattern(m: Material, size: int) -> np.ndarray:
    """Zero-mean-ish pattern (size, size) in about [-1, 1]; rows are the tile's v axis, columns u."""
    # One generator per material name: the same tile on every call and machine.
    rng = np.random.default_rng(int.from_bytes(m.name.encode()[:8].ljust(8, b"\0"), "little"))
    u = (np.arange(size) + 0.5) / size
    uu, vv = np.meshgrid(u, u)
    if m.pattern == "none":
        return np.zeros((size, size))
    if m.pattern == "speckle":
        return 2.0 * (0.6 * _value_noise(rng, size, 8) + 0.4 * rng.random((size, size))) - 1.0
    if m.pattern == "grain":
        # Rings along v bent by low-frequency noise: long wavy stripes along u.
        warp = _value_noise(rng, size, 4)
        return np.sin(2 * np.pi * (6 * vv + 1.5 * warp)) * 0.8 + 0.2 * (2 * _value_noise(rng, size, 16) - 1)
    if m.pattern == "planks":
        # Four planks across v, each with its own shade and grain, seams dark, staggered butt joints.
        plank = np.floor(vv * 4).astype(int)
        shade = rng.uniform(-0.6, 0.6, 4)[plank]
        grain = 0.35 * np.sin(2 * np.pi * (24 * vv + 2 * _value_noise(rng, size, 4)))
        seam = (np.abs(vv * 4 - np.round(vv * 4)) < 0.03) | (np.abs(((uu + 0.5 * (plank % 2)) % 1.0) - 0.5) < 0.006)
        return np.where(seam, -1.0, shade + grain)
    if m.pattern == "tiles":
        grout = (np.abs(uu * 2 - np.round(uu * 2)) < 0.03) | (np.abs(vv * 2 - np.round(vv * 2)) < 0.03)
        tile = rng.uniform(-0.25, 0.25, (2, 2))[np.floor(vv * 2).astype(int), np.floor(uu * 2).astype(int)]
        return np.where(grout, -1.0, tile + 0.15 * (2 * _value_noise(rng, size, 16) - 1))
    if m.pattern == "weave":
        return 0.6 * np.sign(np.sin(2 * np.pi * 8 * uu) * np.sin(2 * np.pi * 8 * vv)) + 0.4 * (
            2 * rng.random((size, size)) - 1
        )
    if m.pattern == "knit":
        return 0.7 * np.sin(2 * np.pi * (8 * uu + 0.5 * np.abs(np.sin(2 * np.pi * 8 * vv)))) + 0.3 * (
            2 * rng.random((size, size)) - 1
        )
    if m.pattern == "brushed":
        return 0.5 * (2 * _value_noise(rng, size, 32)[:, :1].repeat(size, axis=1) - 1) + 0.5 * (
            2 * rng.random((size, 1)) - 1
        )
    if m.pattern == "leaves":
        blobs = _value_noise(rng, size, 6) + 0.5 * _value_noise(rng, size, 12)
        return 2.0 * (blobs / blobs.max()) - 1.0
    raise ValueError(f"material {m.name!r}: unknown pattern {m.pattern!r}")


@lru_cache(maxsize=4)
def texture_tiles(size: int = TEXTURE_SIZE) -> np.ndarray:
    """Brightness factors (len(MATERIALS), size, size) float32, each tile ``1 + contrast * pattern``.

    Deterministic (each material's generator is seeded by its name); read-only.
    """
    tiles = np.stack([1.0 + m.contrast * np.clip(_pattern(m, size), -1.0, 1.0) for m in MATERIALS]).astype(np.float32)
    tiles.setflags(write=False)
    return tiles


def texture_scales() -> np.ndarray:
    """Texels per meter (len(MATERIALS),) float32: ``TEXTURE_SIZE / period``."""
    return np.array([TEXTURE_SIZE / m.period for m in MATERIALS], dtype=np.float32)
