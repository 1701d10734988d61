"""Headless CPU renderer: pinhole camera rays cast into the scene with open3d's Embree ray caster.

``open3d.t.geometry.RaycastingScene`` is used on purpose instead of open3d's OffscreenRenderer, which
needs Vulkan/EGL and takes seconds per frame on these machines. One ray per pixel gives, per pixel, the
hit distance and the triangle hit; the rest is arithmetic on flat float32 arrays:

* **depth** is metric z-depth along the optical axis: ray directions are built with a unit component
  along the optical axis, so the ray parameter ``t_hit`` already *is* the z-depth (no division).
* **object_ids** is the triangle's object id (``-1`` for structure and for rays that hit nothing).
* **rgb** depends on the look (``EnvConfig.look``):

  - ``shaded`` (default): Lambertian shading with ambient light, a directional "daylight" and a point
    light under the ceiling at the room's centre (inverse-square fall-off, softened near the lamp),
    times the triangle's material texture (:mod:`.materials`) looked up at the hit point. Shading
    uses the fact that every pixel's hit point lies on its triangle's plane: the point light's
    ``n . (L - p)`` is the light's signed distance to that plane, a per-triangle constant, so per
    pixel only the distance ``|L - p|`` is computed (about 40 element-wise float32 operations per
    pixel in all). Procedural meshes have outward normals (closed parts, structure facing into the
    room), so a face turned away from a light gets only the ambient term; real-scan meshes have no
    reliable winding and are lit two-sided (``|n . l|``). Optional hard shadows (``shadows=True``)
    cast a second ray per pixel towards the point light, about doubling the cost.
  - ``flat``: the triangle's color times a fixed per-triangle factor (ambient plus ``|n . l|`` for
    one directional light), precomputed into a ``uint8`` table so a frame costs one gather; the
    look before materials existed, kept for comparisons and for the fastest rendering.

Camera frame: pixel ``(u, v)`` (column, row) with ``v`` growing downwards; the optical axis points
along the pose's yaw, tilted down by ``pitch_deg``; the camera sits at ``(x, y, eye_height)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from a2c_ppo_acktr.envs.materials import TEXTURE_SIZE, texture_scales, texture_tiles
from a2c_ppo_acktr.envs.scene import Scene

# Fixed light for flat shading: from above and slightly to the side so that walls facing +x and +y
# get different brightness (corners stay visible) and floor/ceiling differ from walls.
_LIGHT_DIR = np.array([0.35, 0.55, 0.76])
_AMBIENT = 0.45
_BACKGROUND_RGB = (0, 0, 0)
LOOKS = ("shaded", "flat")


@dataclass(frozen=True)
class Lighting:
    """Lights of the shaded look (intensities multiply the surface color; 1 = its full color).

    Attributes:
        ambient: Light reaching every surface.
        sun: Directional light along ``sun_dir`` (from the surface towards the light).
        sun_dir: Direction of the directional light, from above and to the side, so that walls of
            different orientation differ in brightness.
        lamp: Point light under the ceiling at the room's centre, at ``lamp_drop`` below the ceiling.
        lamp_radius: Distance (m) within which the lamp's fall-off is softened: intensity
            ``lamp * cos / (1 + (d / lamp_radius)^2)``, so a surface right under it is not blown out.
    """

    ambient: float = 0.38
    sun: float = 0.22
    sun_dir: tuple[float, float, float] = (0.35, 0.55, 0.76)
    lamp: float = 0.75
    lamp_drop: float = 0.3
    lamp_radius: float = 2.5


@dataclass(frozen=True)
class Pose:
    """Agent pose on the floor: position (m) and heading ``yaw_deg`` (CCW from +x)."""

    x: float
    y: float
    yaw_deg: float


@dataclass(frozen=True)
class Camera:
    """Pinhole camera with square pixels.

    Attributes:
        width: Image width in pixels.
        height: Image height in pixels.
        fov_deg: Horizontal field of view in degrees.
        eye_height: Height of the optical center above the floor (m).
        pitch_deg: Downward tilt of the optical axis in degrees (0 = level, positive looks down).
    """

    width: int = 224
    height: int = 224
    fov_deg: float = 90.0
    eye_height: float = 1.5
    pitch_deg: float = 0.0

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ValueError(f"Camera size must be positive, got {self.width}x{self.height}")
        if not 0.0 < self.fov_deg < 180.0:
            raise ValueError(f"Camera.fov_deg={self.fov_deg} must be in (0, 180) degrees")
        if not -89.0 <= self.pitch_deg <= 89.0:
            raise ValueError(f"Camera.pitch_deg={self.pitch_deg} must be in [-89, 89] degrees")

    @classmethod
    def from_env_config(cls, cfg) -> "Camera":
        """Square camera from an ``EnvConfig`` (``image_size``, ``fov_deg``, ``eye_height``)."""
        return cls(width=cfg.image_size, height=cfg.image_size, fov_deg=cfg.fov_deg, eye_height=cfg.eye_height)

    @property
    def focal_px(self) -> float:
        """Focal length in pixels (same for both axes)."""
        return (self.width / 2.0) / np.tan(np.deg2rad(self.fov_deg) / 2.0)

    def basis(self, yaw_deg: float) -> np.ndarray:
        """Rows: right, down, forward unit vectors (3, 3) in the world frame for a heading."""
        yaw, pitch = np.deg2rad(yaw_deg), np.deg2rad(self.pitch_deg)
        forward = np.array([np.cos(pitch) * np.cos(yaw), np.cos(pitch) * np.sin(yaw), -np.sin(pitch)])
        right = np.array([np.sin(yaw), -np.cos(yaw), 0.0])
        down = np.cross(forward, right)
        return np.stack([right, down, forward])


@dataclass
class Frame:
    """One rendered view.

    Attributes:
        rgb: (H, W, 3) uint8.
        depth: (H, W) float32 z-depth in meters, ``inf`` where nothing is hit.
        object_ids: (H, W) int32 object id per pixel, -1 for structure or nothing.
        pose: The pose it was rendered from.
    """

    rgb: np.ndarray
    depth: np.ndarray
    object_ids: np.ndarray
    pose: Pose | None = None


def visible_objects(frame: Frame, min_pixels: int = 20) -> list[int]:
    """Ids of objects covering at least ``min_pixels`` pixels of a frame, in increasing id order."""
    ids = frame.object_ids[frame.object_ids >= 0]
    if ids.size == 0:
        return []
    counts = np.bincount(ids)
    return [int(i) for i in np.flatnonzero(counts >= max(1, min_pixels))]


class Renderer:
    """Renders RGB, depth and object-id frames of one scene from one camera.

    Args:
        scene: The scene to render.
        camera: Intrinsics and eye height.
        num_threads: Threads for the ray caster (0 = open3d's default, all cores).
        max_rays_per_cast: ``render_many`` splits larger batches into several casts.
        look: ``shaded`` (lights, materials, textures) or ``flat`` (one color per triangle).
        shadows: Shaded look only: hard shadows from the point light (a second ray per pixel).
        lighting: Light intensities and directions of the shaded look.
    """

    def __init__(
        self,
        scene: Scene,
        camera: Camera,
        num_threads: int = 0,
        max_rays_per_cast: int = 1 << 22,
        look: str = "shaded",
        shadows: bool = False,
        lighting: Lighting | None = None,
    ) -> None:
        import open3d as o3d  # heavy import kept out of module import

        if look not in LOOKS:
            raise ValueError(f"Renderer look={look!r} is not one of {list(LOOKS)}")
        self._o3d = o3d
        self.scene = scene
        self.camera = camera
        self.look = look
        self.shadows = bool(shadows)
        self.lighting = lighting or Lighting()
        self.num_threads = int(num_threads)
        self.max_rays_per_cast = int(max_rays_per_cast)
        if scene.num_triangles == 0:
            raise ValueError(f"scene {scene.scene_id!r} has no triangles to render")
        self._raycaster = o3d.t.geometry.RaycastingScene()
        self._raycaster.add_triangles(
            o3d.core.Tensor(np.ascontiguousarray(scene.vertices, dtype=np.float32)),
            o3d.core.Tensor(np.ascontiguousarray(scene.triangles, dtype=np.uint32)),
        )
        # The tables' last row is the "nothing hit" entry (see render_many).
        normals = scene.triangle_normals().astype(np.float64)
        self._id_table = np.concatenate([scene.triangle_object_ids, np.array([-1], dtype=np.int32)])
        if look == "flat":
            light = _LIGHT_DIR / np.linalg.norm(_LIGHT_DIR)
            shade = _AMBIENT + (1.0 - _AMBIENT) * np.abs(normals @ light)
            rgb = np.clip(scene.triangle_colors * shade[:, None] * 255.0 + 0.5, 0, 255).astype(np.uint8)
            self._rgb_table = np.concatenate([rgb, np.array([_BACKGROUND_RGB], dtype=np.uint8)])
        else:
            self._init_shaded(normals)
        # Camera-frame ray directions as (right, down, forward) with forward = 1, so that t_hit is
        # z-depth; stored in the world frame for yaw 0 and rotated about z per pose.
        f = camera.focal_px
        u = (np.arange(camera.width) + 0.5 - camera.width / 2.0) / f
        v = (np.arange(camera.height) + 0.5 - camera.height / 2.0) / f
        uu, vv = np.meshgrid(u, v)
        cam_dirs = np.stack([uu, vv, np.ones_like(uu)], axis=-1).reshape(-1, 3)
        self._dirs_yaw0 = (cam_dirs @ camera.basis(0.0)).astype(np.float32)  # (H*W, 3) world, yaw 0

    @classmethod
    def for_env(cls, scene: Scene, cfg) -> "Renderer":
        """The renderer an ``EnvConfig`` asks for: its camera, ``look`` and ``shadows``."""
        return cls(scene, Camera.from_env_config(cfg), look=cfg.look, shadows=cfg.shadows)

    def _init_shaded(self, normals: np.ndarray) -> None:
        """Per-triangle tables of the shaded look (see the module docstring for the derivation)."""
        scene, light = self.scene, self.lighting
        center = scene.room_center
        self.lamp_position = np.array([center[0], center[1], scene.ceiling_height - light.lamp_drop])
        sun_dir = np.asarray(light.sun_dir, dtype=np.float64)
        sun = normals @ (sun_dir / np.linalg.norm(sun_dir))
        # Signed distance of the lamp to each triangle's plane: n . (L - p) for every p on the triangle.
        first = scene.vertices[scene.triangles[:, 0]].astype(np.float64)
        lamp_height = normals @ self.lamp_position - np.einsum("ij,ij->i", normals, first)
        if scene.dataset == "procedural":  # outward normals (tests/test_furniture.py): one-sided light
            sun, lamp_height = np.maximum(sun, 0.0), np.maximum(lamp_height, 0.0)
        else:  # scans: no reliable winding
            sun, lamp_height = np.abs(sun), np.abs(lamp_height)

        def table(values: np.ndarray, miss: float, dtype) -> np.ndarray:
            return np.concatenate([np.asarray(values), np.asarray([miss])]).astype(dtype)

        self._shade_const = table(light.ambient + light.sun * sun, 0.0, np.float32)
        self._shade_lamp = table(light.lamp * lamp_height, 0.0, np.float32)
        self._base255 = np.concatenate([scene.triangle_colors * 255.0, np.array([_BACKGROUND_RGB])]).astype(np.float32)
        materials = scene.triangle_materials.astype(np.int64)
        self._tex_offset = table(materials * TEXTURE_SIZE * TEXTURE_SIZE, 0, np.int32)
        self._tex_scale = table(texture_scales()[materials], 0.0, np.float32)
        # Triplanar mapping: the texture spans the two world axes across the dominant normal axis.
        self._tex_axis = table(np.argmax(np.abs(normals), axis=1), 2, np.uint8)
        self._tiles = texture_tiles().reshape(-1)
        self._workspaces: dict[tuple[int, ...], dict[str, np.ndarray]] = {}

    def rays(self, poses: Sequence[Pose], out: np.ndarray | None = None) -> np.ndarray:
        """Rays (N, H, W, 6) float32 ``[origin, direction]`` for some poses.

        Args:
            poses: Camera poses.
            out: Optional C-contiguous float32 buffer of the right shape to fill (saves allocation).
        """
        cam = self.camera
        n = len(poses)
        shape = (n, cam.height, cam.width, 6)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"ray buffer must be C-contiguous float32 {shape}, got {out.dtype} {out.shape}")
        flat = out.reshape(n, -1, 6)
        # Directions at yaw 0 rotated about z per pose: x' = c x - s y, y' = s x + c y, z' = z.
        # Done for all poses at once; cheaper than a (HW, 3) @ (3, 3) matmul per pose.
        yaw = np.deg2rad(np.array([p.yaw_deg for p in poses], dtype=np.float64))
        c = np.cos(yaw).astype(np.float32)[:, None]
        s = np.sin(yaw).astype(np.float32)[:, None]
        d0 = self._dirs_yaw0
        flat[:, :, 0] = np.array([p.x for p in poses], dtype=np.float32)[:, None]
        flat[:, :, 1] = np.array([p.y for p in poses], dtype=np.float32)[:, None]
        flat[:, :, 2] = cam.eye_height
        flat[:, :, 3] = c * d0[:, 0] - s * d0[:, 1]
        flat[:, :, 4] = s * d0[:, 0] + c * d0[:, 1]
        flat[:, :, 5] = d0[:, 2]
        return out

    def cast(self, rays: np.ndarray) -> dict:
        """Raw ``cast_rays`` on prepared rays (zero-copy hand-over); returns open3d tensors."""
        return self._raycaster.cast_rays(self._o3d.core.Tensor.from_numpy(rays), nthreads=self.num_threads)

    def render(self, pose: Pose) -> Frame:
        """Render one frame."""
        return self.render_many([pose])[0]

    def render_many(self, poses: Sequence[Pose]) -> list[Frame]:
        """Render several poses with a single ray cast (all rays in one call, up to ``max_rays_per_cast``)."""
        poses = list(poses)
        if not poses:
            return []
        per_cast = max(1, self.max_rays_per_cast // (self.camera.width * self.camera.height))
        if len(poses) > per_cast:  # bound memory: open3d returns ~40 bytes per ray
            return [f for i in range(0, len(poses), per_cast) for f in self.render_many(poses[i : i + per_cast])]
        rays = self.rays(poses)
        hits = self.cast(rays)
        depth = hits["t_hit"].numpy()
        # INVALID_ID (2**32 - 1) read as int32 is -1, which np.take maps to the tables' last row,
        # the "nothing hit" entry; np.take is ~4x faster than fancy indexing here.
        prim = hits["primitive_ids"].numpy().view(np.int32)
        if self.look == "flat":
            rgb = np.take(self._rgb_table, prim, axis=0)
        else:  # frame by frame: one frame's temporaries stay in cache (measured 1.8x faster than all at once)
            rgb = np.empty(prim.shape + (3,), dtype=np.uint8)
            for i in range(len(poses)):
                rgb[i] = self._shade(rays[i], depth[i], prim[i])
        ids = np.take(self._id_table, prim)
        return [Frame(rgb=rgb[i], depth=depth[i], object_ids=ids[i], pose=p) for i, p in enumerate(poses)]

    def _workspace(self, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        """Reused float32/int32 temporaries for ``_shade``: fresh multi-megabyte arrays would be new
        pages from the OS on every call, which measured about as slow as the arithmetic itself."""
        work = self._workspaces.get(shape)
        if work is None:
            if len(self._workspaces) >= 4:  # a sweep batch and a single view are the usual two shapes
                self._workspaces.clear()
            f32 = ("t", "px", "py", "pz", "qx", "qy", "qz", "d2", "lamp", "shade", "scale")
            work = {k: np.empty(shape, np.float32) for k in f32}
            work.update(
                texel=np.empty(shape, np.int32), tmp=np.empty(shape, np.int32), rgb=np.empty(shape + (3,), np.float32)
            )
            self._workspaces[shape] = work
        return work

    def _shade(self, rays: np.ndarray, t_hit: np.ndarray, prim: np.ndarray) -> np.ndarray:
        """Shaded-look colors (..., 3) uint8 from rays (..., 6), hit distances (...) and triangles (...).

        Gathers use ``np.take(..., out=..., mode="wrap")``: with ``out``, the default mode="raise"
        buffers the whole result (several times slower), and "wrap" maps the miss index -1 to the
        tables' last row just as plain indexing does.
        """
        w = self._workspace(t_hit.shape)
        px, py, pz, qx, qy, qz, d2, lamp, shade = (
            w[k] for k in ("px", "py", "pz", "qx", "qy", "qz", "d2", "lamp", "shade")
        )
        t = np.minimum(t_hit, np.float32(1e4), out=w["t"])  # misses (inf) read every table's background row
        for k, p in enumerate((px, py, pz)):  # hit point p = origin + t * direction
            np.multiply(t, rays[..., 3 + k], out=p)
            p += rays[..., k]
        # float32 scalars throughout: a float64 operand would promote every array (2x the time).
        for p, q, c in zip((px, py, pz), (qx, qy, qz), self.lamp_position):
            np.subtract(np.float32(c), p, out=q)
        np.multiply(qx, qx, out=d2)
        d2 += np.float32(1e-6)
        for q in (qy, qz):
            np.multiply(q, q, out=lamp)
            d2 += lamp
        # cos = plane distance / d and fall-off 1 / (1 + d^2 / r^2), over the per-triangle plane distance.
        np.multiply(d2, np.float32(1.0 / self.lighting.lamp_radius**2), out=lamp)
        lamp += np.float32(1.0)
        np.sqrt(d2, out=d2)
        lamp *= d2
        np.divide(np.take(self._shade_lamp, prim, out=shade, mode="wrap"), lamp, out=lamp)
        if self.shadows:
            lamp *= ~self._occluded(px, py, pz, qx, qy, qz)
        np.take(self._shade_const, prim, out=shade, mode="wrap")
        shade += lamp
        # Texture: the two world axes across the triangle's dominant normal axis, in texels.
        axis = np.take(self._tex_axis, prim)
        scale = np.take(self._tex_scale, prim, out=w["scale"], mode="wrap")
        a = np.where(axis == 0, py, px)
        b = np.where(axis == 2, py, pz)
        a *= scale
        b *= scale
        mask = np.int32(TEXTURE_SIZE - 1)
        texel, tmp = w["texel"], w["tmp"]
        np.bitwise_and(b.astype(np.int32), mask, out=texel)
        texel *= np.int32(TEXTURE_SIZE)
        np.bitwise_and(a.astype(np.int32), mask, out=tmp)
        texel += tmp
        texel += np.take(self._tex_offset, prim, out=tmp, mode="wrap")
        shade *= np.take(self._tiles, texel, out=lamp, mode="wrap")
        rgb = np.take(self._base255, prim, axis=0, out=w["rgb"], mode="wrap")
        rgb *= shade[..., None]
        return np.minimum(rgb, np.float32(255.0), out=rgb)

    def _occluded(self, px, py, pz, qx, qy, qz) -> np.ndarray:
        """Whether the segment from each hit point to the lamp is blocked (a second ray cast)."""
        rays = np.empty(px.shape + (6,), dtype=np.float32)
        eps = np.float32(1e-3)  # start just off the surface towards the lamp, so the surface does not shadow itself
        rays[..., 0], rays[..., 1], rays[..., 2] = px + eps * qx, py + eps * qy, pz + eps * qz
        rays[..., 3], rays[..., 4], rays[..., 5] = qx, qy, qz
        t = self.cast(rays)["t_hit"].numpy()
        return t < 1.0 - 2 * eps  # the direction is the full vector to the lamp: t = 1 at the lamp

    def project(self, pose: Pose, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Project world points (N, 3) to pixel coordinates.

        Returns:
            ``(uv, depth)``: (N, 2) float pixel coordinates (column, row; pixel centers at ``+0.5``)
            and (N,) z-depth; points behind the camera have depth <= 0.
        """
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        origin = np.array([pose.x, pose.y, self.camera.eye_height])
        local = (pts - origin) @ self.camera.basis(pose.yaw_deg).T  # (right, down, forward)
        z = local[:, 2]
        f = self.camera.focal_px
        with np.errstate(divide="ignore", invalid="ignore"):
            u = self.camera.width / 2.0 + f * local[:, 0] / z
            v = self.camera.height / 2.0 + f * local[:, 1] / z
        return np.stack([u, v], axis=1), z

    visible_objects = staticmethod(visible_objects)
