"""ScanNet, ARKitScenes and ScanNet++ loaders on tiny files written in the real formats (ASCII and binary PLY),
and the raw label -> VSI-Bench category tables they apply (``envs/data/``, ``scripts/make_label_maps.py``)."""

import ast
import fnmatch
import importlib.util
import json
import logging
import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from a2c_ppo_acktr.envs.real_scans import (
    SceneLoadError,
    find_scan_names,
    find_scene,
    load_arkitscenes_scene,
    load_scannet_scene,
    load_scannetpp_scene,
    read_ply_mesh,
)
from a2c_ppo_acktr.envs.scan_labels import (
    LABEL_TABLES,
    VOCABULARY_TABLE,
    LabelMapError,
    benchmark_categories,
    label_map,
    parse_label_table,
)
from a2c_ppo_acktr.envs.scene import yaw_rotation

# ARKitScenes 3DOD class_names (apple/ARKitScenes threedod/benchmark_scripts/utils/taxonomy.py).
ARKIT_CLASSES = [
    "cabinet",
    "refrigerator",
    "shelf",
    "stove",
    "bed",
    "sink",
    "washer",
    "toilet",
    "bathtub",
    "oven",
    "dishwasher",
    "fireplace",
    "stool",
    "chair",
    "table",
    "tv_monitor",
    "sofa",
]
UNIT_BOX = np.array([[x, y, z] for z in (-0.5, 0.5) for y in (-0.5, 0.5) for x in (-0.5, 0.5)])
BOX_FACES = np.array(
    [
        [0, 2, 1],
        [1, 2, 3],
        [4, 5, 6],
        [5, 7, 6],
        [0, 1, 4],
        [1, 5, 4],
        [2, 6, 3],
        [3, 6, 7],
        [0, 4, 2],
        [2, 4, 6],
        [1, 3, 5],
        [3, 7, 5],
    ]
)


class MeshParts:
    """A mesh built from parts with their own vertices, remembering each part's vertex/face ranges."""

    def __init__(self):
        self.v, self.f, self.c, self.vert_part, self.face_part = [], [], [], [], []
        self.n = 0

    def add(self, verts, faces, color, part):
        self.v.append(np.asarray(verts, float))
        self.f.append(np.asarray(faces) + self.n)
        self.c.append(np.tile(color, (len(verts), 1)))
        self.vert_part += [part] * len(verts)
        self.face_part += [part] * len(faces)
        self.n += len(verts)

    def box(self, center, extent, color, part, rotation=np.eye(3)):
        self.add(np.asarray(center) + (UNIT_BOX * extent) @ rotation.T, BOX_FACES, color, part)

    def quad(self, corners, color, part):
        self.add(corners, [[0, 1, 2], [0, 2, 3]], color, part)

    def arrays(self):
        return np.concatenate(self.v), np.concatenate(self.f), np.concatenate(self.c).astype(np.uint8)


def room(floor_z, x0, x1, y0, y1, height=2.5):
    m = MeshParts()
    m.quad([[x0, y0, floor_z], [x1, y0, floor_z], [x1, y1, floor_z], [x0, y1, floor_z]], (120, 120, 120), "floor")
    corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    for k in range(4):
        (a, b), (c, d) = corners[k], corners[(k + 1) % 4]
        m.quad(
            [[a, b, floor_z], [c, d, floor_z], [c, d, floor_z + height], [a, b, floor_z + height]],
            (200, 200, 190),
            "wall",
        )
    return m


def write_ply(path, vertices, faces, colors, binary):
    header = [
        "ply",
        f"format {'binary_little_endian' if binary else 'ascii'} 1.0",
        "comment tiny test mesh",
        f"element vertex {len(vertices)}",
        "property float x",
        "property float y",
        "property float z",
        "property uchar red",
        "property uchar green",
        "property uchar blue",
        "property uchar alpha",
        f"element face {len(faces)}",
        "property list uchar int vertex_indices",
        "end_header",
    ]
    if binary:
        vdt = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1"), ("a", "u1")])
        va = np.zeros(len(vertices), vdt)
        va["x"], va["y"], va["z"] = vertices.T
        va["r"], va["g"], va["b"] = colors.T
        va["a"] = 255
        fdt = np.dtype([("n", "u1"), ("i", "<i4", (3,))])
        fa = np.zeros(len(faces), fdt)
        fa["n"], fa["i"] = 3, faces
        path.write_bytes(("\n".join(header) + "\n").encode() + va.tobytes() + fa.tobytes())
    else:
        lines = header + [f"{x:.6f} {y:.6f} {z:.6f} {r} {g} {b} 255" for (x, y, z), (r, g, b) in zip(vertices, colors)]
        lines += [f"3 {a} {b} {c}" for a, b, c in faces]
        path.write_text("\n".join(lines) + "\n")


# ScanNet: raw room x in [-1, 3], y in [-1, 2], floor at z = 0; axis alignment turns by +90 degrees
# about z and shifts by (1, 2, 0.5): x' = -y + 1, y' = x + 2, z' = z + 0.5.
ALIGN = np.array([[0, -1, 0, 1], [1, 0, 0, 2], [0, 0, 1, 0.5], [0, 0, 0, 1]], dtype=float)
SEG_OF = {"floor": 10, "wall": 11, "chair": 12, "table": 13}


def make_scannet(tmp_path, binary, name="scene0001_00"):
    d = tmp_path / name
    d.mkdir(parents=True)
    m = room(0.0, -1.0, 3.0, -1.0, 2.0)
    m.box((1.0, 0.5, 0.4), (0.5, 0.6, 0.8), (200, 30, 30), "chair")
    m.box((-0.2, 1.2, 0.375), (1.2, 0.7, 0.75), (30, 30, 200), "table")
    v, f, c = m.arrays()
    vp = np.array(m.vert_part)
    # One extra triangle joining two chair vertices and one floor vertex: majority -> chair.
    chair_v = np.flatnonzero(vp == "chair")
    floor_v = np.flatnonzero(vp == "floor")
    f = np.concatenate([f, [[chair_v[0], chair_v[1], floor_v[0]]]])
    write_ply(d / f"{name}_vh_clean_2.ply", v, f, c, binary)
    (d / f"{name}_vh_clean_2.0.010000.segs.json").write_text(
        json.dumps({"sceneId": name, "segIndices": [SEG_OF[p] for p in vp]})
    )
    groups = [
        {"id": i, "objectId": i, "label": lab, "segments": [SEG_OF[lab]] + ([99] if lab == "table" else [])}
        for i, lab in enumerate(["floor", "wall", "chair", "table"])
    ]
    (d / f"{name}.aggregation.json").write_text(json.dumps({"sceneId": name, "segGroups": groups}))
    (d / f"{name}.txt").write_text(
        "colorHeight = 968\naxisAlignment = " + " ".join(str(x) for x in ALIGN.ravel()) + "\nnumVertices = 1\n"
    )
    return d, m, f


@pytest.mark.parametrize("binary", [False, True])
def test_scannet_loader(tmp_path, binary):
    d, m, faces = make_scannet(tmp_path, binary)
    s = load_scannet_scene(d)
    assert s.scene_id == "scene0001_00" and s.dataset == "scannet"
    assert sorted(s.label_counts()) == ["chair", "table"]  # floor/wall stay structure
    chair = s.objects_by_label("chair")[0]
    assert chair.object_id == 2
    # Aligned center: (-0.5 + 1, 1 + 2, 0.4 + 0.5), then the floor (z' = 0.5) moves to 0.
    np.testing.assert_allclose(chair.center, [0.5, 3.0, 0.4], atol=1e-5)
    np.testing.assert_allclose(chair.extent, [0.6, 0.5, 0.8], atol=1e-5)  # x/y swapped by the turn
    np.testing.assert_allclose(chair.rotation, np.eye(3))
    assert s.vertices[:, 2].min() == pytest.approx(0.0, abs=1e-5)
    assert s.ceiling_height == pytest.approx(2.5, abs=1e-3)
    assert s.room_area == pytest.approx(12.0, abs=1e-4)  # 4 x 3 m room
    fp = s.floor_polygon
    np.testing.assert_allclose(fp.min(axis=0), [-1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(fp.max(axis=0), [2.0, 5.0], atol=1e-5)
    parts = np.array(m.face_part + ["chair"])  # the bridge triangle goes to the chair by majority
    expected = np.select([parts == "chair", parts == "table"], [2, 3], -1)
    np.testing.assert_array_equal(s.triangle_object_ids, expected)
    red = s.triangle_colors[s.triangle_object_ids == 2]
    np.testing.assert_allclose(red[0], np.array([200, 30, 30]) / 255.0, atol=1e-6)


def make_arkit(tmp_path, vid="41069042", labels=("sofa", "stool")):
    """An ARKitScenes scan: a 30-degree-turned box (``labels[0]``) and a small upright one (``labels[1]``),
    both real 3DOD class names by default."""
    d = tmp_path / vid
    d.mkdir()
    floor = -1.3
    m = room(floor, 0.0, 4.0, 0.0, 3.0)
    rot = yaw_rotation(30.0)
    m.box((1.5, 1.5, floor + 0.45), (1.0, 0.6, 0.9), (10, 200, 10), "big", rot)
    m.box((3.0, 2.0, floor + 0.2), (0.3, 0.3, 0.4), (10, 10, 200), "small")
    v, f, c = m.arrays()
    write_ply(d / f"{vid}_3dod_mesh.ply", v, f, c, binary=True)
    ann = {
        "data": [
            {
                "label": labels[0],
                "segments": {
                    "obbAligned": {
                        "centroid": [1.5, 1.5, floor + 0.45],
                        "axesLengths": [1.0, 0.6, 0.9],
                        "normalizedAxes": rot.T.ravel().tolist(),
                    }
                },
            },
            {
                "label": labels[1],
                "segments": {
                    "obbAligned": {
                        "centroid": [3.0, 2.0, floor + 0.2],
                        "axesLengths": [0.3, 0.3, 0.4],
                        "normalizedAxes": np.eye(3).ravel().tolist(),
                    }
                },
            },
        ]
    }
    (d / f"{vid}_3dod_annotation.json").write_text(json.dumps(ann))
    return d, m


def test_arkitscenes_loader(tmp_path):
    d, m = make_arkit(tmp_path)
    s = load_arkitscenes_scene(d)
    assert s.scene_id == "41069042" and s.dataset == "arkitscenes"
    assert s.label_counts() == {"sofa": 1, "stool": 1} and s.excluded_labels == {}
    cab = s.objects_by_label("sofa")[0]
    # normalizedAxes rows are the box axes: the object's rotation columns are the yawed axes.
    np.testing.assert_allclose(cab.rotation, yaw_rotation(30.0), atol=1e-9)
    np.testing.assert_allclose(cab.center, [1.5, 1.5, 0.45], atol=1e-5)
    assert cab.yaw_deg == pytest.approx(30.0)
    assert cab.longest_side == pytest.approx(1.0)
    parts = np.array(m.face_part)
    expected = np.select([parts == "big", parts == "small"], [0, 1], -1)
    np.testing.assert_array_equal(s.triangle_object_ids, expected)
    assert s.vertices[:, 2].min() == pytest.approx(0.0, abs=1e-5)
    assert s.room_area == pytest.approx(12.0, abs=1e-4)


# ScanNet++: room x in [0, 5], y in [0, 4], floor at z = -0.7. Groups (objectId, raw label, part, has obb):
# the table's group also holds the book's segment (ScanNet++ lets annotations overlap; the smaller
# object wins), the office chair has no obb (its vertices' box is used), "lamp" is a benchmark
# category but not one of ScanNet++'s 84 instance classes (excluded), "book" is left out by the benchmark.
PP_FLOOR = -0.7
PP_TABLE_YAW = 30.0
PP_PARTS = {
    "table": ((2.0, 2.0, PP_FLOOR + 0.375), (1.2, 0.7, 0.75), PP_TABLE_YAW),
    "book": ((2.0, 2.0, PP_FLOOR + 0.8), (0.2, 0.15, 0.05), 0.0),
    "chair": ((3.5, 1.0, PP_FLOOR + 0.45), (0.5, 0.5, 0.9), 0.0),
    "ceiling lamp": ((2.5, 3.0, PP_FLOOR + 2.4), (0.4, 0.4, 0.1), 0.0),
    "lamp": ((0.5, 3.5, PP_FLOOR + 0.8), (0.3, 0.3, 1.6), 0.0),
}
PP_GROUPS = [
    (1, "wall", ["wall"], False),
    (2, "floor", ["floor"], False),
    (3, "table", ["table", "book"], True),
    (4, "book", ["book"], True),
    (5, "office chair", ["chair"], False),
    (6, "ceiling lamp", ["ceiling lamp"], True),
    (7, "lamp", ["lamp"], True),
]


def make_scannetpp(root, sid="3db0a1c8f3", binary=True):
    """A ScanNet++ scene ``root/<sid>/scans/`` (mesh_aligned_0.05.ply, segments.json, segments_anno.json)."""
    d = root / sid / "scans"
    d.mkdir(parents=True)
    m = room(PP_FLOOR, 0.0, 5.0, 0.0, 4.0)
    for part, (center, extent, yaw) in PP_PARTS.items():
        m.box(center, extent, (50, 60 + len(part), 70), part, yaw_rotation(yaw))
    v, f, c = m.arrays()
    write_ply(d / "mesh_aligned_0.05.ply", v, f, c, binary)
    seg_of = {p: 100 + 7 * i for i, p in enumerate(["wall", "floor", *PP_PARTS])}
    (d / "segments.json").write_text(json.dumps({"sceneId": sid, "segIndices": [seg_of[p] for p in m.vert_part]}))
    groups = []
    for oid, label, parts, with_obb in PP_GROUPS:
        g = {"id": oid, "objectId": oid, "label": label, "segments": [seg_of[p] for p in parts]}
        if with_obb:
            center, extent, yaw = PP_PARTS[parts[0]]
            g["obb"] = {
                "centroid": list(center),
                "axesLengths": list(extent),
                "normalizedAxes": yaw_rotation(yaw).T.ravel().tolist(),
            }
        groups.append(g)
    (d / "segments_anno.json").write_text(json.dumps({"sceneId": sid, "segGroups": groups}))
    return root / sid, m


@pytest.mark.parametrize("binary", [False, True])
def test_scannetpp_loader(tmp_path, binary):
    from a2c_ppo_acktr.envs.navigation import is_free

    d, m = make_scannetpp(tmp_path, binary=binary)
    s = load_scannetpp_scene(d)
    assert s.scene_id == "3db0a1c8f3" and s.dataset == "scannetpp"
    assert s.label_counts() == {
        "table": 1,
        "chair": 1,
        "ceiling light": 1,
    }  # office chair -> chair, ceiling lamp -> ceiling light
    assert s.excluded_labels == {"book": 1, "lamp": 1}
    table = s.object(3)
    np.testing.assert_allclose(
        table.rotation, yaw_rotation(PP_TABLE_YAW), atol=1e-9
    )  # normalizedAxes rows are the axes
    np.testing.assert_allclose(table.center, [2.0, 2.0, 0.375], atol=1e-5)  # the floor moved to z = 0
    np.testing.assert_allclose(table.extent, [1.2, 0.7, 0.75])
    chair = s.object(5)  # no obb: the box of its vertices
    np.testing.assert_allclose(chair.center, [3.5, 1.0, 0.45], atol=1e-5)
    np.testing.assert_allclose(chair.extent, [0.5, 0.5, 0.9], atol=1e-5)
    np.testing.assert_allclose(chair.rotation, np.eye(3))
    assert s.vertices[:, 2].min() == pytest.approx(0.0, abs=1e-5)
    assert s.ceiling_height == pytest.approx(2.5, abs=1e-3)
    assert s.room_area == pytest.approx(20.0, abs=1e-4)
    parts = np.array(m.face_part)
    # The book's triangles are in the table's group too: the smaller book wins, and is excluded.
    expected = np.select([parts == "table", parts == "chair", parts == "ceiling lamp"], [3, 5, 6], -1)
    np.testing.assert_array_equal(s.triangle_object_ids, expected)
    assert s.occupancy is not None
    assert not is_free(s, 0.5, 3.5, 0.1)  # the excluded lamp still blocks walking
    assert not is_free(s, 3.5, 1.0, 0.1) and is_free(s, 4.3, 3.3, 0.1)


def test_scannetpp_table_is_closed_and_lists_the_benchmarks_classes():
    table = label_map("scannetpp")
    assert table.lookup("office chair") == ("mapped", "chair") and table.lookup("mouse") == ("mapped", "computer mouse")
    assert table.lookup("kitchen cabinet") == ("excluded", None) and table.lookup("towel") == ("excluded", None)
    # "lamp" and "mirror" are benchmark categories (ScanNet rows), but not ScanNet++ instance classes.
    assert table.lookup("lamp") == ("excluded", None) and table.lookup("Mirror") == ("excluded", None)
    assert table.lookup("wall") == ("structure", None)
    assert len(table.categories) + len(table.excluded) == 84
    assert label_map("scannet").lookup("zorbulator") == ("excluded", None) and label_map("arkitscenes").lookup(
        "lamp"
    ) == ("mapped", "lamp")


def test_scannetpp_missing_and_corrupt_files_name_the_file(tmp_path):
    d, _ = make_scannetpp(tmp_path)
    scans = d / "scans"
    anno = json.loads((scans / "segments_anno.json").read_text())
    bad = json.loads(json.dumps(anno))
    bad["segGroups"][2]["obb"]["normalizedAxes"] = [1, 0, 0, 1, 0, 0, 0, 0, 1]
    (scans / "segments_anno.json").write_text(json.dumps(bad))
    with pytest.raises(
        SceneLoadError, match=r"segments_anno.json.*object 3 \(table\) has a malformed obb.*orthonormal"
    ):
        load_scannetpp_scene(d)
    del bad["segGroups"][2]["obb"]["centroid"]
    (scans / "segments_anno.json").write_text(json.dumps(bad))
    with pytest.raises(SceneLoadError, match="segments_anno.json.*malformed obb.*centroid"):
        load_scannetpp_scene(d)
    bad = json.loads(json.dumps(anno))
    bad["segGroups"][3]["objectId"] = 3
    (scans / "segments_anno.json").write_text(json.dumps(bad))
    with pytest.raises(SceneLoadError, match="segments_anno.json.*objectId 3 appears in more than one"):
        load_scannetpp_scene(d)
    (scans / "segments_anno.json").write_text(json.dumps({"segGroups": [{"label": "table"}]}))
    with pytest.raises(SceneLoadError, match="segments_anno.json.*expected 'segGroups' with objectId"):
        load_scannetpp_scene(d)
    (scans / "segments_anno.json").write_text("{not json")
    with pytest.raises(SceneLoadError, match="segments_anno.json.*not valid JSON"):
        load_scannetpp_scene(d)
    (scans / "segments_anno.json").write_text(json.dumps(anno))
    (scans / "segments.json").write_text(json.dumps({"segIndices": [1, 2]}))
    with pytest.raises(SceneLoadError, match="segments.json.*2 segIndices for .* mesh vertices"):
        load_scannetpp_scene(d)
    (scans / "segments.json").unlink()
    with pytest.raises(SceneLoadError, match="segments.json.*does not exist"):
        load_scannetpp_scene(d)
    ply = scans / "mesh_aligned_0.05.ply"
    ply.write_bytes(ply.read_bytes()[:-40])
    with pytest.raises(SceneLoadError, match="mesh_aligned_0.05.ply.*truncated"):
        load_scannetpp_scene(d)
    ply.unlink()
    with pytest.raises(SceneLoadError, match="mesh_aligned_0.05.ply.*does not exist"):
        load_scannetpp_scene(d)


def test_find_scene_layouts(tmp_path):
    make_scannet(tmp_path / "scans", binary=True, name="scene0002_00")
    assert find_scene(tmp_path, "scannet", "scene0002_00").scene_id == "scene0002_00"
    (tmp_path / "3dod" / "Validation").mkdir(parents=True)
    make_arkit(tmp_path / "3dod" / "Validation", vid="4200")
    assert find_scene(tmp_path, "arkitscenes", "4200").dataset == "arkitscenes"
    with pytest.raises(SceneLoadError, match="scene9999_00.*not found"):
        find_scene(tmp_path, "scannet", "scene9999_00")
    (tmp_path / "scannetpp" / "data").mkdir(parents=True)
    make_scannetpp(tmp_path / "scannetpp" / "data", sid="0a5c013435")
    assert find_scene(tmp_path, "scannetpp", "0a5c013435").dataset == "scannetpp"
    assert find_scan_names(tmp_path, "scannetpp") == ["0a5c013435"] and find_scan_names(tmp_path, "arkitscenes") == [
        "4200"
    ]
    with pytest.raises(SceneLoadError, match="unknown dataset"):
        find_scene(tmp_path, "matterport", "x")


def test_missing_and_corrupt_files_name_the_file(tmp_path):
    d, _, _ = make_scannet(tmp_path, binary=True)
    ply = d / "scene0001_00_vh_clean_2.ply"
    good = ply.read_bytes()
    ply.write_bytes(good[: len(good) - 40])  # truncated binary body
    with pytest.raises(SceneLoadError, match="vh_clean_2.ply.*truncated"):
        load_scannet_scene(d)
    ply.write_bytes(b"not a mesh at all")
    with pytest.raises(SceneLoadError, match="vh_clean_2.ply.*not a PLY"):
        load_scannet_scene(d)
    ply.unlink()
    with pytest.raises(SceneLoadError, match="vh_clean_2.ply.*does not exist"):
        load_scannet_scene(d)
    with pytest.raises(SceneLoadError, match="does not exist"):
        read_ply_mesh(tmp_path / "nope.ply")


def test_scannet_metadata_errors(tmp_path):
    d, _, _ = make_scannet(tmp_path, binary=False)
    (d / "scene0001_00.txt").write_text("colorHeight = 968\n")
    with pytest.raises(SceneLoadError, match=r"scene0001_00\.txt.*axisAlignment"):
        load_scannet_scene(d)
    (d / "scene0001_00.txt").write_text("axisAlignment = " + " ".join(["1"] * 16) + "\n")
    (d / "scene0001_00_vh_clean_2.0.010000.segs.json").write_text(json.dumps({"segIndices": [1, 2, 3]}))
    with pytest.raises(SceneLoadError, match="segs.json.*3 segIndices"):
        load_scannet_scene(d)
    (d / "scene0001_00.aggregation.json").write_text("{broken")
    with pytest.raises(SceneLoadError, match="aggregation.json.*not valid JSON"):
        load_scannet_scene(d)


def test_arkit_annotation_errors(tmp_path):
    d, _ = make_arkit(tmp_path)
    (d / "41069042_3dod_annotation.json").write_text(json.dumps({"data": [{"label": "chair", "segments": {}}]}))
    with pytest.raises(SceneLoadError, match="annotation.json.*obbAligned"):
        load_arkitscenes_scene(d)
    (d / "41069042_3dod_annotation.json").unlink()
    with pytest.raises(SceneLoadError, match="annotation.json.*does not exist"):
        load_arkitscenes_scene(d)


def test_scan_occupancy_blocks_unlabelled_walls_and_unscanned_floor(tmp_path):
    import dataclasses

    from a2c_ppo_acktr.envs.navigation import is_free, try_move
    from a2c_ppo_acktr.envs.renderer import Pose

    vid = "777"
    d = tmp_path / vid
    d.mkdir()
    z0 = -1.3
    m = MeshParts()
    # L-shaped scanned floor: [0,4]x[0,2] plus [0,2]x[2,4]; its convex hull also covers the notch.
    m.quad([[0, 0, z0], [4, 0, z0], [4, 2, z0], [0, 2, z0]], (120, 120, 120), "floor")
    m.quad([[0, 2, z0], [2, 2, z0], [2, 4, z0], [0, 4, z0]], (120, 120, 120), "floor")
    # An unlabelled partition wall at x = 1 from y = 0 to 1.2 (one big quad, as decimated scans have).
    m.quad([[1, 0, z0], [1, 1.2, z0], [1, 1.2, z0 + 2.5], [1, 0, z0 + 2.5]], (200, 200, 190), "wall")
    v, f, c = m.arrays()
    write_ply(d / f"{vid}_3dod_mesh.ply", v, f, c, binary=False)
    (d / f"{vid}_3dod_annotation.json").write_text(json.dumps({"data": []}))
    s = load_arkitscenes_scene(d)
    assert s.occupancy is not None and s.objects == []
    assert s.contains_xy(3.0, 2.6)  # inside the hull...
    assert not is_free(s, 3.0, 2.6, 0.2)  # ...but never scanned
    assert is_free(s, 3.0, 1.0, 0.2) and is_free(s, 1.0, 3.0, 0.2)
    pose, collided = try_move(s, Pose(0.4, 0.5, 0.0), 0.0, 2.0, 0.2)
    assert collided and 1.0 - 0.2 - 0.08 <= pose.x <= 1.0 - 0.2 + 1e-6
    assert is_free(dataclasses.replace(s, occupancy=None), 0.9, 0.5, 0.2)  # only the raster sees that wall


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.replace("element vertex ", "element vertex x", 1), "header line .*element vertex x"),
        (lambda t: t.replace("element face ", "element face\n#", 1), "header line"),
        (
            lambda t: t.replace("property list uchar int vertex_indices", "property list uchar", 1),
            "header line .*property list uchar",
        ),
        (
            lambda t: t.replace("\n0.", "\nnan", 1) if "\n0." in t else t.replace("\n-", "\nnan ", 1),
            "not finite|malformed",
        ),
        (
            lambda t: t.replace("\n0.", "\n1000.", 1) if "\n0." in t else t.replace("\n-1.", "\n1000.", 1),
            "spans .* m; indoor scans",
        ),
    ],
)
def test_malformed_ply_inputs_are_scene_load_errors(tmp_path, mutate, message):
    """Malformed headers, NaN vertices and a vertex 1 km away: a SceneLoadError naming the file (and
    no subdivision blow-up), never a raw ValueError/IndexError."""
    d, _, _ = make_scannet(tmp_path, binary=False)
    ply = d / "scene0001_00_vh_clean_2.ply"
    text = ply.read_text()
    changed = mutate(text)
    assert changed != text
    ply.write_text(changed)
    with pytest.raises(SceneLoadError, match=f"vh_clean_2.ply.*({message})"):
        load_scannet_scene(d)


def test_scan_annotation_faults_are_scene_load_errors(tmp_path):
    d, _, _ = make_scannet(tmp_path, binary=False)
    agg = json.loads((d / "scene0001_00.aggregation.json").read_text())
    agg["segGroups"][3]["objectId"] = agg["segGroups"][2]["objectId"]
    (d / "scene0001_00.aggregation.json").write_text(json.dumps(agg))
    with pytest.raises(SceneLoadError, match="aggregation.json.*objectId 2 appears in more than one"):
        load_scannet_scene(d)
    segs = json.loads((d / "scene0001_00_vh_clean_2.0.010000.segs.json").read_text())
    segs["segIndices"] = [float(s) + 0.5 for s in segs["segIndices"]]
    (d / "scene0001_00_vh_clean_2.0.010000.segs.json").write_text(json.dumps(segs))
    with pytest.raises(SceneLoadError, match="segs.json.*list of integers"):
        load_scannet_scene(d)
    (tmp_path / "ark").mkdir()
    a, _ = make_arkit(tmp_path / "ark")
    ann = json.loads((a / "41069042_3dod_annotation.json").read_text())
    ann["data"][0]["segments"]["obbAligned"]["centroid"][0] = float("nan")
    (a / "41069042_3dod_annotation.json").write_text(json.dumps(ann))
    with pytest.raises(SceneLoadError, match="annotation.json.*non-finite box"):
        load_arkitscenes_scene(a)


# ---------------------------------------------------------------------------- benchmark categories
# Raw labels as ScanNet annotators typed them (aggregation.json), with the benchmark category each becomes
# (None: no VSI-Bench category, so excluded). The room is 6 x 5 m, floor at z = 0, axis alignment identity.
REAL_SCANNET_OBJECTS = [
    ("office chair", (1.0, 1.0, 0.45), (0.5, 0.5, 0.9), "chair"),
    ("Office Chair", (2.0, 1.0, 0.45), (0.5, 0.5, 0.9), "chair"),
    ("kitchen cabinets", (5.0, 4.0, 0.45), (1.2, 0.6, 0.9), "cabinet"),
    ("trash can", (0.5, 4.3, 0.3), (0.3, 0.3, 0.6), "trash bin"),  # VSI-Bench's ScanNet rows say "trash bin"
    ("tv", (3.0, 4.7, 1.2), (1.0, 0.1, 0.6), "tv"),
    ("bookshelf", (5.6, 1.5, 1.0), (0.4, 1.0, 2.0), "bookshelf"),
    ("nightstand", (1.0, 3.0, 0.3), (0.5, 0.4, 0.6), None),  # no evidence that the benchmark asks about it
    ("paper towel dispenser", (4.0, 0.2, 1.3), (0.3, 0.15, 0.35), None),
    ("zorbulator", (3.0, 3.0, 0.2), (0.3, 0.3, 0.4), None),  # not in ScanNet's label table at all
]


def make_scannet_objects(root, name, objects, binary=True):
    """A ScanNet scan of a 6 x 5 m room (floor and wall groups) with one box and one segment per object."""
    d = root / name
    d.mkdir(parents=True)
    m = room(0.0, 0.0, 6.0, 0.0, 5.0)
    for i, (_, center, extent, *_) in enumerate(objects):
        m.box(center, extent, (20 * i, 100, 200), f"obj{i}")
    v, f, c = m.arrays()
    write_ply(d / f"{name}_vh_clean_2.ply", v, f, c, binary)
    seg = {"floor": 1, "wall": 2, **{f"obj{i}": 10 + i for i in range(len(objects))}}
    (d / f"{name}_vh_clean_2.0.010000.segs.json").write_text(json.dumps({"segIndices": [seg[p] for p in m.vert_part]}))
    labels = ["floor", "wall"] + [o[0] for o in objects]
    groups = [
        {"id": k, "objectId": k, "label": lab, "segments": [seg[["floor", "wall"][k] if k < 2 else f"obj{k - 2}"]]}
        for k, lab in enumerate(labels)
    ]
    (d / f"{name}.aggregation.json").write_text(json.dumps({"sceneId": name, "segGroups": groups}))
    (d / f"{name}.txt").write_text("axisAlignment = " + " ".join(str(x) for x in np.eye(4).ravel()) + "\n")
    return d, m


def test_scannet_raw_labels_become_benchmark_categories_and_exclusions_are_counted(tmp_path, caplog):
    from a2c_ppo_acktr.envs.navigation import is_free

    d, m = make_scannet_objects(tmp_path, "scene0100_00", REAL_SCANNET_OBJECTS)
    with caplog.at_level(logging.INFO, logger="a2c_ppo_acktr.envs.real_scans"):
        s = load_scannet_scene(d)
    assert s.label_counts() == {"chair": 2, "cabinet": 1, "trash bin": 1, "tv": 1, "bookshelf": 1}
    # Per scene, by raw label (normalised); walls and floors are structure, not exclusions.
    assert s.excluded_labels == {"nightstand": 1, "paper towel dispenser": 1, "zorbulator": 1}
    ids = {o.object_id: o.label for o in s.objects}
    assert ids == {2: "chair", 3: "chair", 4: "cabinet", 5: "trash bin", 6: "tv", 7: "bookshelf"}
    parts = np.array(m.face_part)
    expected = np.full(len(parts), -1)
    for i, (*_, category) in enumerate(REAL_SCANNET_OBJECTS):
        if category is not None:
            expected[parts == f"obj{i}"] = i + 2
    np.testing.assert_array_equal(s.triangle_object_ids, expected)  # excluded boxes: geometry kept, id -1
    assert not is_free(s, 1.0, 3.0, 0.1)  # the excluded nightstand still blocks walking
    assert is_free(s, 3.0, 2.0, 0.1)
    lines = [r.getMessage() for r in caplog.records if r.name == "a2c_ppo_acktr.envs.real_scans"]
    assert len(lines) == 1
    assert "scene0100_00" in lines[0] and "6 objects" in lines[0] and "3 excluded" in lines[0]
    assert "nightstand x1" in lines[0] and "paper towel dispenser x1" in lines[0]


def test_excluded_objects_are_never_named_in_questions(tmp_path):
    from a2c_ppo_acktr.envs.questions import GENERATORS, QuestionUnavailable, generate_question, unique_objects

    d, _ = make_scannet_objects(tmp_path, "scene0101_00", REAL_SCANNET_OBJECTS, binary=False)
    s = load_scannet_scene(d)
    vocab = benchmark_categories()
    # The candidates for "the <category>" are the single-instance benchmark categories only.
    assert sorted(o.label for o in unique_objects(s)) == ["bookshelf", "cabinet", "trash bin", "tv"]
    kept = [o.object_id for o in s.objects]
    texts, asked = [], 0
    for qtype in GENERATORS:
        for seed in range(8):
            try:
                q = generate_question(s, qtype, np.random.default_rng(seed), appearance_order=kept)
            except QuestionUnavailable:
                continue
            asked += 1
            texts.append(" ".join([q.question, *(q.options or [])]).lower())
            assert set(q.object_ids) <= set(kept)
            assert all(s.object(i).label in vocab for i in q.object_ids)
    assert asked >= 40
    joined = "\n".join(texts)
    assert "how many chair(s) are in this room?" in joined
    for raw in ("nightstand", "paper towel", "zorbulator", "office chair", "kitchen cabinets", "trash can"):
        assert raw not in joined


def test_arkitscenes_tv_monitor_is_tv_and_left_out_classes_are_excluded(tmp_path):
    d, m = make_arkit(tmp_path, labels=("cabinet", "tv_monitor"))
    s = load_arkitscenes_scene(d)
    # VSI-Bench calls tv_monitor "tv" and never asks about ARKitScenes cabinets, shelves, sinks, ovens.
    assert s.label_counts() == {"tv": 1} and s.object(1).label == "tv"
    assert s.excluded_labels == {"cabinet": 1}
    parts = np.array(m.face_part)
    np.testing.assert_array_equal(s.triangle_object_ids, np.where(parts == "small", 1, -1))
    table = label_map("arkitscenes")
    assert table.lookup("tv_monitor") == ("mapped", "tv")
    # Labels outside the table: kept when already a benchmark category, else excluded.
    assert table.lookup("Pillow") == ("mapped", "pillow") and table.lookup("desk") == ("excluded", None)
    assert [c for c in ARKIT_CLASSES if table.lookup(c)[0] == "excluded"] == ["cabinet", "shelf", "sink", "oven"]


def test_vsibench_rows_name_objects_the_scan_now_has(tmp_path):
    """A real VSI-Bench ScanNet row (scene0664_02) names mirror, door and trash bin; the loaded scan
    (raw labels mirror, door, trash can) must have exactly those categories."""
    from a2c_ppo_acktr.envs.vsibench import scene_for_row

    objects = [
        ("mirror", (1.0, 0.1, 1.4), (0.6, 0.05, 0.9)),
        ("door", (5.9, 2.5, 1.0), (0.05, 0.9, 2.0)),
        ("trash can", (3.0, 4.6, 0.3), (0.3, 0.3, 0.6)),
    ]
    make_scannet_objects(tmp_path / "scans", "scene0664_02", objects)
    row = {
        "id": 1,
        "dataset": "scannet",
        "scene_name": "scene0664_02",
        "question_type": "object_rel_direction_hard",
        "question": "If I am standing by the mirror and facing the door, is the trash bin to my front-left, "
        "front-right, back-left, or back-right?",
        "options": ["A. front-left", "B. front-right", "C. back-left", "D. back-right"],
        "ground_truth": "A",
    }
    s = scene_for_row(row, tmp_path)
    named = re.search(r"standing by the (.*?) and facing the (.*?), is the (.*?) to", row["question"]).groups()
    assert sorted(named) == sorted(s.label_counts()) == ["door", "mirror", "trash bin"]


def test_label_tables_are_installed_package_data_and_well_formed():
    data = resources.files("a2c_ppo_acktr.envs").joinpath("data")
    files = sorted(p.name for p in data.iterdir() if p.name.endswith(".tsv"))
    assert files == sorted([VOCABULARY_TABLE, *LABEL_TABLES.values()])
    vocab = benchmark_categories()
    assert {"chair", "table", "tv", "trash bin", "trash can", "ceiling light"} <= set(vocab)
    assert all(c == c.strip().lower() and vocab[c] for c in vocab)
    for dataset, name in LABEL_TABLES.items():
        lines = [
            ln.split("\t")
            for ln in data.joinpath(name).read_text(encoding="utf-8").splitlines()
            if ln and not ln.startswith("#")
        ]
        header, rows = lines[0], lines[1:]
        keys = [" ".join(r[0].replace("_", " ").lower().split()) for r in rows]
        assert len(keys) == len(set(keys)), f"{name}: duplicate raw labels"
        status, target = header.index("status"), header.index("vsibench_category")
        assert {r[status] for r in rows} <= {"mapped", "excluded", "structure"}
        assert all((r[target] in vocab) if r[status] == "mapped" else r[target] == "" for r in rows)
        assert set(label_map(dataset).categories.values()) <= set(vocab)
    scannet = [
        ln for ln in data.joinpath(LABEL_TABLES["scannet"]).read_text().splitlines() if ln and not ln.startswith("#")
    ]
    assert scannet[0].split("\t")[:4] == ["raw_category", "category", "nyu40class", "count"] and len(scannet) == 1 + 607
    assert len(label_map("arkitscenes").categories) + len(label_map("arkitscenes").excluded) == len(ARKIT_CLASSES)
    assert len(label_map("scannetpp").categories) + len(label_map("scannetpp").excluded) == 84
    # Installs carry the tables: setup.py's package_data covers every file, MANIFEST.in does for sdists.
    root = Path(__file__).resolve().parents[1]
    call = next(
        n
        for n in ast.walk(ast.parse((root / "setup.py").read_text()))
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"
    )
    package_data = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "package_data"))
    assert all(any(fnmatch.fnmatch(f"data/{f}", pat) for pat in package_data["a2c_ppo_acktr.envs"]) for f in files)
    assert "recursive-include a2c_ppo_acktr/envs/data *.tsv" in (root / "MANIFEST.in").read_text()


def test_committed_tables_match_the_generator():
    """scripts/make_label_maps.py regenerates the committed tables from ScanNet's public label table."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("make_label_maps", root / "scripts" / "make_label_maps.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    if gen.default_table() is None:
        pytest.skip("open3d's copy of scannetv2-labels.combined.tsv is not installed")
    assert gen.main(["--check"]) == 0
    assert [r["raw_label"] for r in gen.arkit_rows()] == ARKIT_CLASSES
    assert len(gen.scannetpp_rows()) == len(set(gen.SCANNETPP_INST_SEG_CATEGORY)) == 84


@pytest.mark.parametrize(
    "rows, message",
    [
        (["chair\tmapped\tchair", "Chair\tmapped\tchair"], r"test.tsv line 4 \(raw 'Chair'\).*already on line 3"),
        (["office chair\tmapped\toffice chair"], "'office chair' is not in"),
        (["nightstand\texcluded\tnightstand"], "excluded label must have no category"),
        (["chair\tkept\tchair"], "status 'kept'"),
        (["chair\tmapped"], "2 fields, the header has 3"),
    ],
)
def test_malformed_label_tables_name_the_line(rows, message):
    text = "\n".join(["# comment", "raw\tstatus\tvsibench_category", *rows]) + "\n"
    with pytest.raises(LabelMapError, match=message):
        parse_label_table("scannet", text, {"chair": "test"}, "test.tsv")
