"""The shaded look: Lambertian light against closed forms, textures fixed on surfaces, shadows."""

import numpy as np
import pytest

from a2c_ppo_acktr.envs.materials import MATERIALS, TEXTURE_SIZE, material_id, texture_scales, texture_tiles
from a2c_ppo_acktr.envs.renderer import Camera, Lighting, Pose, Renderer
from a2c_ppo_acktr.envs.scene import MeshBuilder, Scene, SceneObject

W, D, H = 4.0, 6.0, 3.0
CAM = Camera(width=64, height=48, fov_deg=90.0, eye_height=1.5)


def _room(floor_material="plain", boxes=(), dataset="procedural", flip_floor=False):
    """A 4 x 6 x 3 m room with a gray floor at z = 0 (normal +z unless ``flip_floor``)."""
    mb = MeshBuilder()
    poly = np.array([[0, 0], [W, 0], [W, D], [0, D]], dtype=float)
    mb.add_flat_polygon(poly[::-1] if flip_floor else poly, 0.0, (0.5, 0.5, 0.5), material=floor_material)
    objects = []
    for k, (center, extent, color) in enumerate(boxes):
        obj = SceneObject.upright(k, "box", center, extent)
        mb.add_object_box(obj, color)
        objects.append(obj)
    v, t, c, i = mb.build()
    if flip_floor:  # a polygon given clockwise is re-oriented by add_flat_polygon; flip the triangles
        t = t[:, ::-1].copy()
    return Scene("shade", dataset, v, t, c, i, objects, poly, H, triangle_materials=mb.triangle_materials())


def _hit_points(r: Renderer, pose: Pose, frame) -> np.ndarray:
    """World hit point (H, W, 3) per pixel from the depth map, computed independently of _shade."""
    rays = r.rays([pose])[0]
    return rays[..., :3] + frame.depth[..., None] * rays[..., 3:]


def _expected_shade(points: np.ndarray, normal: np.ndarray, r: Renderer, one_sided: bool) -> np.ndarray:
    light: Lighting = r.lighting
    sun_dir = np.asarray(light.sun_dir) / np.linalg.norm(light.sun_dir)
    to_lamp = r.lamp_position - points
    d = np.linalg.norm(to_lamp, axis=-1)
    cos_lamp = to_lamp @ normal / d
    cos_sun = float(sun_dir @ normal)
    clamp = (lambda x: np.maximum(x, 0.0)) if one_sided else np.abs
    return (
        light.ambient + light.sun * clamp(cos_sun) + light.lamp * clamp(cos_lamp) / (1.0 + (d / light.lamp_radius) ** 2)
    )


@pytest.mark.parametrize("dataset", ["procedural", "scannet"])
def test_plain_floor_matches_lambert_closed_form(dataset):
    scene = _room(dataset=dataset)
    r = Renderer(scene, CAM)
    pose = Pose(1.0, 3.0, 0.0)
    frame = r.render(pose)
    floor = np.isfinite(frame.depth) & (frame.object_ids == -1)
    floor[: CAM.height // 2 + 2] = False  # rows below the horizon only
    assert floor.sum() > 200
    pts = _hit_points(r, pose, frame)
    assert np.abs(pts[floor][:, 2]).max() < 1e-3  # the hits are on the floor
    expected = np.minimum(0.5 * 255.0 * _expected_shade(pts[floor], np.array([0.0, 0.0, 1.0]), r, True), 255.0)
    got = frame.rgb[floor].astype(float)
    assert np.abs(got - expected[:, None]).max() <= 1.0  # uint8 truncation
    # The lamp term varies across the floor (a flat-colored floor would be one value).
    assert got[:, 0].max() - got[:, 0].min() > 10


def test_one_sided_light_for_procedural_two_sided_for_scans():
    # A floor whose triangles face down: procedural meshes trust the winding (ambient only, the
    # light is "behind" the face); scans do not (|n . l|, same brightness as a correct floor).
    pose = Pose(1.0, 3.0, 0.0)
    right_frame = Renderer(_room(), CAM).render(pose)
    floor = np.isfinite(right_frame.depth)
    wrong = Renderer(_room(flip_floor=True), CAM).render(pose).rgb[floor]
    right = right_frame.rgb[floor]
    scan_wrong = Renderer(_room(flip_floor=True, dataset="scannet"), CAM).render(pose).rgb[floor]
    assert int(wrong.max()) == int(wrong.min()) == int(0.5 * 255 * Lighting().ambient)
    assert right.min() > wrong.max() + 20
    np.testing.assert_allclose(scan_wrong.astype(int), right.astype(int), atol=1)


def test_texture_is_fixed_on_the_surface_and_view_independent():
    # Lambertian light and a texture looked up at the hit point: a floor point has one color from
    # every viewpoint. Pixels of view B are matched to view A through their world points.
    scene = _room(floor_material="parquet")
    r = Renderer(scene, Camera(width=160, height=120, fov_deg=90.0, eye_height=1.5))
    a_pose, b_pose = Pose(1.0, 2.0, 60.0), Pose(2.5, 1.5, 100.0)
    fa, fb = r.render(a_pose), r.render(b_pose)
    pts_b = _hit_points(r, b_pose, fb)
    floor_b = np.isfinite(fb.depth) & (np.abs(pts_b[..., 2]) < 1e-3)
    uv, z = r.project(a_pose, pts_b[floor_b])
    cols, rows = np.floor(uv[:, 0]).astype(int), np.floor(uv[:, 1]).astype(int)
    ok = (z > 0) & (cols >= 0) & (cols < 160) & (rows >= 0) & (rows < 120)
    # Compare where A's pixel centre hits the same texel as B's (parquet: 1.6 m / 64 = 2.5 cm), so
    # that the two colors differ only by the lamp term across a few centimetres.
    pts_a = _hit_points(r, a_pose, fa)
    scale = texture_scales()[material_id("parquet")]
    same = ok.copy()
    texel_a = np.floor(pts_a[rows[ok], cols[ok], :2] * scale)
    texel_b = np.floor(pts_b[floor_b][ok][:, :2] * scale)
    same[ok] = (texel_a == texel_b).all(axis=1) & (np.abs(pts_a[rows[ok], cols[ok], 2]) < 1e-3)
    assert same.sum() > 100
    ca = fa.rgb[rows[same], cols[same]].astype(int)
    cb = fb.rgb[floor_b][same].astype(int)
    assert np.abs(ca - cb).max() <= 3
    # And the texture is visible: the parquet floor is not one smooth gradient like a plain one.
    plain = Renderer(_room(), r.camera).render(b_pose).rgb[floor_b].astype(int)
    textured = fb.rgb[floor_b].astype(int)
    assert np.abs(np.diff(textured[:, 0])).mean() > 2 * np.abs(np.diff(plain[:, 0])).mean()


def test_texture_tiles_match_their_material_and_are_deterministic():
    tiles = texture_tiles()
    assert tiles.shape == (len(MATERIALS), TEXTURE_SIZE, TEXTURE_SIZE) and tiles.dtype == np.float32
    for m, tile in zip(MATERIALS, tiles):
        if m.contrast == 0:
            assert (tile == 1.0).all(), m.name
        else:
            assert tile.std() > 0.2 * m.contrast and abs(tile.mean() - 1.0) < 0.1, m.name
            assert tile.min() >= 1.0 - m.contrast - 1e-6 and tile.max() <= 1.0 + m.contrast + 1e-6
    texture_tiles.cache_clear()
    np.testing.assert_array_equal(texture_tiles(), tiles)
    assert texture_scales()[material_id("parquet")] == pytest.approx(TEXTURE_SIZE / 1.6)
    with pytest.raises(KeyError, match="known"):
        material_id("velvet")


def test_shadow_darkens_only_what_the_box_hides_from_the_lamp():
    # A 1 m table-top slab at 1.2 m right under the lamp (room center 2, 3): the floor under it is
    # in shadow (lamp term gone); floor far to the side is unchanged.
    slab = ((2.0, 3.0, 1.2), (1.0, 1.0, 0.05), (0.8, 0.2, 0.2))
    scene = _room(boxes=[slab])
    pose = Pose(2.0, 0.3, 90.0)
    lit = Renderer(scene, CAM).render(pose)
    shadowed_r = Renderer(scene, CAM, shadows=True)
    dark = shadowed_r.render(pose)
    pts = _hit_points(shadowed_r, pose, dark)
    floor = np.isfinite(dark.depth) & (np.abs(pts[..., 2]) < 1e-3)
    # Floor points whose segment to the lamp passes through the slab's footprint at z = 1.2.
    lamp = shadowed_r.lamp_position
    pts = np.where(floor[..., None], pts, 0.0)
    s = (1.2 - pts[..., 2]) / (lamp[2] - pts[..., 2])
    at = pts[..., :2] + s[..., None] * (lamp[:2] - pts[..., :2])
    under = floor & (np.abs(at[..., 0] - 2.0) < 0.45) & (np.abs(at[..., 1] - 3.0) < 0.45)
    clear = floor & ((np.abs(at[..., 0] - 2.0) > 0.55) | (np.abs(at[..., 1] - 3.0) > 0.55))
    assert under.sum() > 20 and clear.sum() > 20
    ambient_sun = (
        0.5
        * 255
        * (Lighting().ambient + Lighting().sun * np.array(Lighting().sun_dir)[2] / np.linalg.norm(Lighting().sun_dir))
    )
    assert np.abs(dark.rgb[under].astype(float) - ambient_sun).max() <= 1.0
    assert (lit.rgb[under].astype(int) > dark.rgb[under].astype(int) + 20).all()
    np.testing.assert_array_equal(dark.rgb[clear], lit.rgb[clear])


def test_flat_look_is_the_per_triangle_table_and_bad_look_is_rejected():
    scene = _room(boxes=[((2.0, 4.0, 0.5), (0.6, 0.6, 1.0), (0.1, 0.7, 0.3))])
    frame = Renderer(scene, CAM, look="flat").render(Pose(2.0, 1.0, 90.0))
    # One color per triangle: the box's front face is a single color.
    face = frame.rgb[frame.object_ids == 0]
    assert len(np.unique(face.reshape(-1, 3), axis=0)) <= 3  # front face plus maybe a sliver of a side
    with pytest.raises(ValueError, match="look"):
        Renderer(scene, CAM, look="photoreal")


def test_shaded_batch_equals_single_frames():
    scene = _room(floor_material="floor_tiles", boxes=[((3.0, 2.0, 0.5), (0.5, 0.5, 1.0), (0.2, 0.4, 0.9))])
    r = Renderer(scene, CAM, shadows=True)
    poses = [Pose(1.0, 1.0 + 0.5 * k, 37.0 * k) for k in range(4)]
    batch = r.render_many(poses)
    for p, f in zip(poses, batch):
        np.testing.assert_array_equal(r.render(p).rgb, f.rgb)


def test_procedural_rooms_are_seen_only_from_the_front_of_their_faces():
    # "No black faces": one-sided light is right only if every surface the camera sees is seen from
    # the side its normal points to (outward parts, structure facing into the room). Check every hit
    # pixel of 360-degree sweeps in several rooms: n . ray_direction < 0.
    from a2c_ppo_acktr.envs.navigation import sample_free_pose
    from a2c_ppo_acktr.envs.procedural import make_procedural_scene

    cam = Camera(width=96, height=96, fov_deg=90.0, eye_height=1.5)
    for seed in range(6):
        scene = make_procedural_scene(seed)
        r = Renderer(scene, cam)
        normals = scene.triangle_normals()
        p = sample_free_pose(scene, np.random.default_rng(seed), 0.2)
        rays = r.rays([Pose(p.x, p.y, p.yaw_deg + 45.0 * k) for k in range(8)])
        prim = r.cast(rays)["primitive_ids"].numpy().view(np.int32)
        hit = prim >= 0
        facing = np.einsum("ij,ij->i", normals[prim[hit]], rays[..., 3:][hit])
        # Grazing hits on edges may round either way; a wrongly wound part would be whole faces.
        assert (facing < 0).mean() > 0.999, (scene.scene_id, float((facing >= 0).mean()))
