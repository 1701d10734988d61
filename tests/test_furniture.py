"""Furniture templates: exact boxes, outward normals, main colors, supports, distinct looks, gallery.

Geometry is checked on the mesh arrays; looks are checked on the renderer's id and depth outputs only
(never on RGB, which depends on the renderer's look).
"""

import hashlib

import numpy as np
import pytest

from a2c_ppo_acktr.envs import procedural
from a2c_ppo_acktr.envs.furniture import PALETTES, PANE_MATERIALS, TEMPLATES, build_object, template
from a2c_ppo_acktr.envs.gallery import main as gallery_main, orbit_camera
from a2c_ppo_acktr.envs.materials import material_id
from a2c_ppo_acktr.envs.procedural import CATEGORIES, make_procedural_scene
from a2c_ppo_acktr.envs.renderer import Renderer
from a2c_ppo_acktr.envs.scene import MeshBuilder, Scene, SceneObject

PANE_IDS = [material_id(m) for m in PANE_MATERIALS]
GLASS, SCREEN = material_id("glass"), material_id("screen")


def _sizes(v, n_random=3, seed=0):
    """Extreme corners of a variant's size ranges plus a few random sizes inside them."""
    rng = np.random.default_rng(seed)
    w, d, h = v.width, v.depth, v.height
    out = [(w[0], d[0], h[0]), (w[1], d[1], h[1]), (w[0], d[1], h[0]), (w[1], d[0], h[1])]
    out += [(rng.uniform(*w), rng.uniform(*d), rng.uniform(*h)) for _ in range(n_random)]
    return [np.array(s) for s in out]


def _build(label, size, placement, look_seed=0, yaw=37.0):
    obj = SceneObject.upright(4, label, (1.5, -2.0, 0.6 + size[2] / 2), size, yaw)
    mb = MeshBuilder()
    main = build_object(mb, obj, np.random.default_rng(look_seed), placement)
    v, t, c, i = mb.build()
    return obj, mb, v.astype(np.float64), t, c, i, mb.triangle_materials(), main


def _areas(v, t):
    return np.linalg.norm(np.cross(v[t[:, 1]] - v[t[:, 0]], v[t[:, 2]] - v[t[:, 0]]), axis=1) / 2


def _dominant_color(colors, areas, materials):
    """Color covering the largest area among the non-pane (not glass / screen) triangles."""
    keep = ~np.isin(materials, PANE_IDS)
    cols, inv = np.unique(colors[keep], axis=0, return_inverse=True)
    return cols[np.argmax(np.bincount(inv.ravel(), areas[keep]))]


def _outward(v, t, primitives):
    """Per closed primitive: each triangle's normal . (its centroid - the primitive's center) > 0."""
    bad = []
    for first, n, center in primitives:
        tri = t[first : first + n]
        a, b, c = v[tri[:, 0]], v[tri[:, 1]], v[tri[:, 2]]
        dots = np.einsum("ij,ij->i", np.cross(b - a, c - a), (a + b + c) / 3 - center)
        if not (dots > 0).all():
            bad.append((first, n))
    return bad


def test_every_category_has_a_template_and_unknown_raises():
    assert set(TEMPLATES) == set(CATEGORIES)
    assert set(PALETTES) == set(CATEGORIES)
    with pytest.raises(KeyError, match="known: .*sofa"):
        template("spaceship")
    with pytest.raises(KeyError, match="spaceship"):
        build_object(
            MeshBuilder(), SceneObject.upright(0, "spaceship", (0, 0, 0.5), (1, 1, 1)), np.random.default_rng(0)
        )


@pytest.mark.parametrize("label", sorted(CATEGORIES))
def test_parts_fill_the_box_exactly_with_outward_normals_and_a_dominant_main_color(label):
    """For every variant and a spread of sizes: every vertex inside the oriented box (1e-5 m), the
    parts' envelope touching all six faces (2 mm), every closed part wound outward, and the main
    color (the one the room keeps distinct per category) covering the largest non-pane area."""
    for vi, v in enumerate(CATEGORIES[label]):
        for si, size in enumerate(_sizes(v, seed=vi)):
            obj, mb, verts, tris, cols, ids, mats, main = _build(label, size, v.placement, look_seed=si)
            where = f"{label} variant {vi} size {np.round(size, 3)}"
            assert (ids == obj.object_id).all() and len(tris) > 0, where
            local = (verts[np.unique(tris)] - obj.center) @ obj.rotation
            half = size / 2
            assert np.abs(local).max(axis=0).tolist() <= (half + 1e-5).tolist(), where
            assert np.all(local.min(axis=0) <= -half + 0.002) and np.all(local.max(axis=0) >= half - 0.002), where
            assert _outward(verts, tris, mb.primitives) == [], where
            assert sum(n for _, n, _ in mb.primitives) == len(tris), where  # every triangle is in a closed part
            dom = _dominant_color(cols, _areas(verts, tris), mats)
            np.testing.assert_allclose(dom, np.clip(main, 0, 1), atol=1e-6, err_msg=where)


def test_same_look_seed_same_mesh_and_looks_vary():
    size = np.array([2.0, 0.9, 0.85])
    a = _build("sofa", size, "wall", look_seed=3)
    b = _build("sofa", size, "wall", look_seed=3)
    c = _build("sofa", size, "wall", look_seed=4)
    for x, y in zip(a[2:7], b[2:7]):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[4], c[4]) or not np.array_equal(a[2], c[2])


def _layout_digest(objects, polygon, height, theme):
    def f64(x):
        return (np.round(np.asarray(x, dtype=np.float64), 6) + 0.0).astype("<f8").tobytes()

    h = hashlib.sha256()
    h.update(theme.encode())
    h.update("|".join(o.label for o in objects).encode())
    for key in ("center", "extent"):
        h.update(f64([getattr(o, key) for o in objects]))
    h.update(f64(polygon))
    h.update(f64(height))
    h.update(f64([np.degrees(np.arctan2(o.rotation[1, 0], o.rotation[0, 0])) for o in objects]))
    return h.hexdigest()[:16]


# Digests of the layouts of seeds 0..4 as generated before the furniture templates existed (from a
# dump of the previous code): restyling must never move, resize, relabel or drop an object.
LAYOUT_DIGESTS = {
    0: "20bc73fd79e5059d",
    1: "7a86a600d35fe0db",
    2: "03b638e1e6dfd831",
    3: "36afc8162273bf2b",
    4: "b9a7142b8bcb2414",
}


def test_layout_is_unchanged_and_independent_of_the_appearance():
    for seed, digest in LAYOUT_DIGESTS.items():
        scene = make_procedural_scene(seed)
        placer, theme = procedural._layout(seed)
        layout_only = [p.obj for p in placer.placed]
        assert [(o.object_id, o.label) for o in scene.objects] == [(o.object_id, o.label) for o in layout_only]
        for a, b in zip(scene.objects, layout_only):
            np.testing.assert_array_equal(a.center, b.center)
            np.testing.assert_array_equal(a.extent, b.extent)
            np.testing.assert_array_equal(a.rotation, b.rotation)
        np.testing.assert_array_equal(scene.floor_polygon, placer.polygon)
        assert scene.ceiling_height == placer.height and scene.theme == theme
        assert _layout_digest(scene.objects, scene.floor_polygon, scene.ceiling_height, theme) == digest, seed


def test_structure_faces_into_the_room_and_has_materials():
    for seed in range(6):
        s = make_procedural_scene(seed)
        struct = s.triangle_object_ids == -1
        v = s.vertices.astype(np.float64)
        n = s.triangle_normals().astype(np.float64)
        tri = s.triangles
        z = v[tri][:, :, 2]
        floor = struct & np.all(np.abs(z) < 1e-6, axis=1)
        ceiling = struct & np.all(np.abs(z - s.ceiling_height) < 1e-4, axis=1)
        walls = struct & ~floor & ~ceiling
        assert floor.any() and ceiling.any() and walls.sum() == 2 * len(s.floor_polygon)
        assert np.all(n[floor, 2] > 0.999) and np.all(n[ceiling, 2] < -0.999)
        centroid = v[tri[walls]].mean(axis=1)
        probe = centroid[:, :2] + 0.01 * n[walls, :2]
        assert np.all(np.abs(n[walls, 2]) < 1e-6) and s.contains_xy(probe[:, 0], probe[:, 1]).all(), s.scene_id
        names = {
            "floor": s.triangle_materials[floor],
            "ceiling": s.triangle_materials[ceiling],
            "walls": s.triangle_materials[walls],
        }
        floor_mat = {"kitchen": {"floor_tiles"}, "bathroom": {"floor_tiles"}, "office": {"carpet", "parquet"}}.get(
            s.theme, {"parquet"}
        )
        assert set(names["floor"].tolist()) <= {material_id(m) for m in floor_mat}, (s.scene_id, s.theme)
        assert set(names["ceiling"].tolist()) == {material_id("ceiling")}
        assert set(names["walls"].tolist()) == {material_id("paint")}
        assert (s.triangle_materials[~struct] != material_id("plain")).all()  # every part has a real material


def test_every_object_part_is_closed_and_outward_in_rooms():
    """Rebuild rooms with the scene's own builder and check every closed part's winding."""
    for seed in range(4):
        placer, theme = procedural._layout(seed)
        mb = MeshBuilder()
        look = np.random.default_rng([seed, 7])
        for p in placer.placed:
            build_object(mb, p.obj, look, p.variant.placement)
        v, t, _, _ = mb.build()
        assert _outward(v.astype(np.float64), t, mb.primitives) == []


def test_items_rest_on_their_support_surface():
    """Things placed ``on`` a bed, sofa, table, ... have the support's geometry right under them:
    rays cast down from just above their bottom hit another object within 1 cm (mattress, seat
    cushions, table top), never the floor far below."""
    import open3d as o3d

    checked = 0
    for seed in range(12):
        placer, _ = procedural._layout(seed)
        scene = make_procedural_scene(seed)
        for p in placer.placed:
            if p.variant.placement != "on":
                continue
            keep = scene.triangle_object_ids != p.obj.object_id
            rc = o3d.t.geometry.RaycastingScene()
            rc.add_triangles(o3d.core.Tensor(scene.vertices), o3d.core.Tensor(scene.triangles[keep].astype(np.uint32)))
            ids = scene.triangle_object_ids[keep]
            w, d = p.obj.extent[:2]
            local = np.array([[0, 0], [w / 4, d / 4], [-w / 4, d / 4], [w / 4, -d / 4], [-w / 4, -d / 4]])
            xy = p.obj.center[:2] + local @ p.obj.rotation[:2, :2].T
            rays = np.concatenate([xy, np.full((5, 1), p.z0 + 0.002), np.tile([0.0, 0.0, -1.0], (5, 1))], axis=1)
            hit = rc.cast_rays(o3d.core.Tensor(rays.astype(np.float32)))
            t_hit = hit["t_hit"].numpy()
            prim = hit["primitive_ids"].numpy().astype(np.int64)
            best = int(np.argmin(t_hit))
            assert t_hit[best] < 0.012, (seed, p.obj.label, t_hit)
            assert ids[prim[best]] >= 0, (seed, p.obj.label)
            checked += 1
    assert checked >= 20


# ------------------------------------------------------------------------------ distinct looks
def _alone_masks(label, size, look_seed, px=128):
    """Render ``label`` alone at ``size`` (yaw 0) from a fixed oblique viewpoint, 35 degrees to its
    front-left and 25 degrees above; returns (silhouette, relief edges, glass mask, screen mask).

    Ids are remapped per triangle so that the renderer's id map tells glass and screen pixels apart
    (object ids 1 and 2); the relief edges are pixels where the inverse depth (affine in the image
    on any plane) has a Laplacian above a 4 mm step, inside the silhouette only, widened by 1 px.
    """
    v = CATEGORIES[label][0]
    obj = SceneObject.upright(0, label, (0.0, 0.0, size[2] / 2), size, 0.0)
    mb = MeshBuilder()
    poly = np.array([[-5.0, -5.0], [5.0, -5.0], [5.0, 5.0], [-5.0, 5.0]])
    mb.add_flat_polygon(poly, 0.0, (0.5, 0.5, 0.5))
    build_object(mb, obj, np.random.default_rng([look_seed, 3]), v.placement)
    vert, tri, col, ids = mb.build()
    mats = mb.triangle_materials()
    ids = np.where((ids == 0) & (mats == GLASS), 1, ids)
    ids = np.where((ids == 0) & (mats == SCREEN), 2, ids)
    marks = [SceneObject.upright(i, m, (0, 0, 0), (0, 0, 0)) for i, m in ((1, "glass"), (2, "screen"))]
    scene = Scene("alone", "procedural", vert, tri, col, ids, [obj] + marks, poly, 3.0)
    camera, pose = orbit_camera(obj, 35.0, 25.0, px)
    frame = Renderer(scene, camera).render(pose)
    sil = frame.object_ids >= 0
    inv = np.where(sil, 1.0 / np.where(sil, frame.depth, 1.0), 0.0)
    lap = np.zeros_like(inv)
    lap[1:-1, 1:-1] = 4 * inv[1:-1, 1:-1] - inv[:-2, 1:-1] - inv[2:, 1:-1] - inv[1:-1, :-2] - inv[1:-1, 2:]
    inner = np.zeros_like(sil)
    inner[1:-1, 1:-1] = sil[1:-1, 1:-1] & sil[:-2, 1:-1] & sil[2:, 1:-1] & sil[1:-1, :-2] & sil[1:-1, 2:]
    z = np.where(sil, frame.depth, 1.0)
    edges = inner & (np.abs(lap) * z * z > 0.004)
    wide = edges.copy()
    wide[1:] |= edges[:-1]
    wide[:-1] |= edges[1:]
    wide[:, 1:] |= edges[:, :-1]
    wide[:, :-1] |= edges[:, 1:]
    return sil, wide, frame.object_ids == 1, frame.object_ids == 2


def _iou(a, b):
    return float((a & b).sum()) / max(1, int((a | b).sum()))


def _part_iou(ma, mb):
    """IoU of part-label maps: relief edges (label 1), plus glass (2) and screen (3) pixels for a pane
    kind only one of the two has (a kind both have, e.g. the glass of a window and of a mirror, is
    what they share, not what tells them apart: then their edges must differ)."""
    la, lb = ma[1].astype(np.int8), mb[1].astype(np.int8)
    for k, label in ((2, 2), (3, 3)):
        if ma[k].any() != mb[k].any():
            la[ma[k]] = label
            lb[mb[k]] = label
    return float(((la == lb) & (la > 0)).sum()) / max(1, int(((la > 0) | (lb > 0)).sum()))


def _common_size(a, b):
    """Per axis, the middle of the overlap of the two first variants' ranges (or of the gap)."""
    va, vb = CATEGORIES[a][0], CATEGORIES[b][0]
    return np.array(
        [
            (max(ra[0], rb[0]) + min(ra[1], rb[1])) / 2
            for ra, rb in ((va.width, vb.width), (va.depth, vb.depth), (va.height, vb.height))
        ]
    )


# Pairs of similar real size whose OUTLINES differ (legs, arms, open frames, round vs square). Two
# objects with the same box render the same silhouette, IoU 1.0, and the box-like pairs below measure
# 0.87-1.0; these measure 0.34 (chair vs stool) to 0.79 (suitcase vs computer tower, monitor vs
# picture), the worst over 3 appearance seeds. The bound leaves 0.06 above the worst pair.
SILHOUETTE_PAIRS = [
    ("chair", "stool"),
    ("chair", "trash can"),
    ("stool", "trash can"),
    ("nightstand", "stool"),
    ("nightstand", "trash can"),
    ("toilet", "chair"),
    ("cabinet", "table"),
    ("dresser", "table"),
    ("tv stand", "table"),
    ("table", "desk"),
    ("coffee table", "table"),
    ("plant", "trash can"),
    ("lamp", "plant"),
    ("computer tower", "trash can"),
    ("backpack", "trash can"),
    ("suitcase", "trash can"),
    ("backpack", "suitcase"),
    ("suitcase", "computer tower"),
    ("monitor", "picture"),
    ("monitor", "mirror"),
    ("clock", "picture"),
]
SILHOUETTE_BOUND = 0.85

# Pairs that are legitimately box-shaped in outline (silhouette IoU 0.82-1.0): compared on their
# parts instead, i.e. what makes a fridge not a cabinet: door splits, handles, drawers, open
# compartments, a porthole, burners, key rows, a pane of glass or a screen. Measured 0.10-0.58 (the
# worst: whiteboard vs picture, frames and a tray vs a frame and paint; then monitor vs tv 0.52,
# which share a screen and differ in bezel and stand). For scale, two looks of the SAME category
# overlap 0.56-1.0 on average (tv 0.56, picture 0.59, refrigerator 0.62, cabinet 0.88; oven, washer,
# dishwasher 1.0: their looks vary only in color). The bound leaves 0.07 above the worst pair.
PART_PAIRS = [
    ("tv stand", "cabinet"),
    ("tv stand", "dresser"),
    ("cabinet", "dresser"),
    ("nightstand", "cabinet"),
    ("nightstand", "dresser"),
    ("sink", "cabinet"),
    ("piano", "cabinet"),
    ("fireplace", "cabinet"),
    ("fireplace", "tv stand"),
    ("radiator", "tv stand"),
    ("refrigerator", "cabinet"),
    ("oven", "cabinet"),
    ("tv stand", "desk"),
    ("coffee table", "tv stand"),
    ("dresser", "desk"),
    ("cabinet", "desk"),
    ("dishwasher", "washer"),
    ("oven", "stove"),
    ("oven", "dishwasher"),
    ("stove", "dishwasher"),
    ("washer", "oven"),
    ("microwave", "printer"),
    ("laptop", "keyboard"),
    ("picture", "mirror"),
    ("window", "picture"),
    ("window", "mirror"),
    ("whiteboard", "picture"),
    ("tv", "picture"),
    ("tv", "mirror"),
    ("monitor", "tv"),
    ("bed", "sofa"),
    ("sofa", "bathtub"),
]
PART_BOUND = 0.65
LOOK_SEEDS = (0, 1, 2)


def test_categories_of_similar_size_look_different():
    cache = {}

    def masks(label, size, seed):
        key = (label, tuple(size), seed)
        if key not in cache:
            cache[key] = _alone_masks(label, size, seed)
        return cache[key]

    report = []
    for a, b in SILHOUETTE_PAIRS:
        size = _common_size(a, b)
        worst = max(_iou(masks(a, size, s)[0], masks(b, size, s)[0]) for s in LOOK_SEEDS)
        report.append(("silhouette", a, b, worst))
    for a, b in PART_PAIRS:
        size = _common_size(a, b)
        worst = max(_part_iou(masks(a, size, s), masks(b, size, s)) for s in LOOK_SEEDS)
        report.append(("parts", a, b, worst))
    bad = [r for r in report if r[3] >= (SILHOUETTE_BOUND if r[0] == "silhouette" else PART_BOUND)]
    assert not bad, bad
    # Sanity of the measure itself: a category against itself (same look) is identical.
    size = _common_size("cabinet", "refrigerator")
    assert _part_iou(masks("cabinet", size, 0), masks("cabinet", size, 0)) == 1.0
    assert _iou(masks("cabinet", size, 0)[0], masks("refrigerator", size, 0)[0]) > 0.9  # both box-like


def test_gallery_writes_contact_sheets(tmp_path, capsys):
    from PIL import Image

    out = gallery_main(
        ["--out", str(tmp_path), "--size", "64", "--categories", "chair", "tv stand", "--rooms", "1", "--seed", "3"]
    )
    cats, rooms = Image.open(out["categories"]), Image.open(out["rooms"])
    label_h = 16
    assert cats.size == (2 * 2 * 64, 64 + label_h)  # two categories x two views, one row
    assert rooms.size == (8 * 64, 64 + label_h)  # eight frames of one room
    assert np.asarray(cats).std() > 5 and np.asarray(rooms).std() > 5
    printed = capsys.readouterr().out
    assert "categories.png" in printed and "rooms.png" in printed
