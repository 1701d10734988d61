"""Loaders that turn ScanNet, ARKitScenes (3DOD) and ScanNet++ scans into :class:`~.scene.Scene` objects.

ScanNet (``<scene_dir>/``):

* ``<scene>_vh_clean_2.ply``: triangle mesh with per-vertex colors;
* ``<scene>_vh_clean_2.0.010000.segs.json``: ``segIndices``, one over-segment id per vertex;
* ``<scene>.aggregation.json``: ``segGroups``, each an object (``objectId``, ``label``, ``segments``);
* ``<scene>.txt``: a line ``axisAlignment = m00 m01 ... m33`` (4x4, row-major) applied to the vertices.

A vertex belongs to the object whose segments contain its segment; a triangle takes the object id
held by at least two of its vertices (-1 when all three differ). Structure labels (wall, floor,
ceiling, ...) stay structure (-1). Object boxes are the **axis-aligned** boxes of the object's vertices
in the aligned frame (rotation = identity); objects without vertices are dropped.

ARKitScenes 3DOD (``<scene_dir>/``):

* ``<video_id>_3dod_mesh.ply``: triangle mesh with per-vertex colors (z up, meters);
* ``<video_id>_3dod_annotation.json``: ``data``, a list of objects with ``label`` and
  ``segments.obbAligned`` = ``{centroid, axesLengths, normalizedAxes}``. ``normalizedAxes`` is a 3x3
  matrix, row-major, whose **rows** are the box axes (ARKitScenes' own tools build box corners as
  ``R.T @ local``), so the :class:`SceneObject` rotation is its transpose.

A triangle whose centroid lies inside an object's box (grown by ``BOX_MARGIN`` = 2 cm, since surface
triangles lie on the box faces) gets that object's id (the smallest box wins where boxes overlap,
since small objects sit on or in large ones; an excluded object's box claims its triangles for -1).
Object ids are the annotation's order (0, 1, ...; excluded objects leave gaps).

ScanNet++ (v1/v2, ``<scene_dir>/scans/``, ``<scene_dir>`` named by the scene id such as ``3db0a1c8f3``):

* ``mesh_aligned_0.05.ply``: triangle mesh with per-vertex colors, already aligned (z up, meters);
* ``segments.json``: ``segIndices``, one segment id per mesh vertex;
* ``segments_anno.json``: ``segGroups``, each an object (``objectId``, ``label``, ``segments``) with
  its oriented box ``obb`` = ``{centroid, axesLengths, normalizedAxes}`` (``normalizedAxes`` row-major,
  its **rows** the box axes, as for ARKitScenes). ``mesh_aligned_0.05_semantic.ply`` is not read.

A vertex belongs to the objects whose segments contain its segment; ScanNet++ lets objects overlap,
and as in ScanNet++'s own single-label preparation the object with the fewest vertices wins. A
triangle then takes an object id by majority as for ScanNet. An object's box is its ``obb`` (the box
VSI-Bench measured); a group without one gets the axis-aligned box of its vertices, and a group with
neither is dropped.

All: the floor height is a low percentile of vertex z and the scene is shifted so the floor is at
z = 0; the ceiling height is a high percentile of z; the floor polygon is the 2-D convex hull of the
vertices within 10 cm of the floor (of all vertices when too few are that low). Triangle colors are
the mean of their vertices' colors. Because a convex hull can span several rooms, a 5 cm occupancy
raster (:func:`build_occupancy`: scanned floor, minus cells with surface between 0.2 and 1.8 m) is
attached as ``Scene.occupancy`` and keeps the agent off walls and out of unscanned space. Missing or unreadable files
raise :class:`SceneLoadError` naming
the file.

Labels speak the benchmark's vocabulary: each raw label is looked up in the dataset's table
(:mod:`~.scan_labels`) and the object's ``label`` is the VSI-Bench category it maps to. An object
whose label has no benchmark category is **excluded**: it is not in ``Scene.objects`` and its
triangles get id -1, so it is still rendered and still blocks walking but no question names it.
``Scene.excluded_labels`` (raw label -> number of objects) records the exclusions and one INFO line
per loaded scan logs them.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np

from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.safe_paths import PathOutsideRoot, inside, plain_name_problem
from a2c_ppo_acktr.envs.scan_labels import clean_label, label_map
from a2c_ppo_acktr.envs.scene import OccupancyGrid, Scene, SceneObject

logger = logging.getLogger(__name__)

FLOOR_PERCENTILE = 1.0
CEILING_PERCENTILE = 99.5
FLOOR_BAND = 0.10  # vertices this close to the floor outline the floor polygon (m)
OCC_CELL = 0.05  # occupancy raster cell (m)
OCC_MIN_Z, OCC_MAX_Z = 0.2, 1.8  # scanned surface between these heights blocks walking (m)
OCC_CLOSE_CELLS = 2  # morphological closing of the scanned-floor mask (fills sampling gaps)
BOX_MARGIN = 0.02  # ARKit: triangle centroids this far outside a box still belong to it (m)


class SceneLoadError(ValueError, UserError):
    """A scan could not be loaded; the message names the file or scene and what was wrong."""


def _log_exclusions(scene: Scene, excluded: Counter) -> None:
    if excluded:
        detail = ", ".join(f"{label} x{n}" for label, n in sorted(excluded.items(), key=lambda kv: (-kv[1], kv[0])))
        logger.info(
            "%s scan %s: %d objects with VSI-Bench categories; %d excluded (no VSI-Bench category, geometry kept): %s",
            scene.dataset,
            scene.scene_id,
            len(scene.objects),
            sum(excluded.values()),
            detail,
        )
    else:
        logger.info(
            "%s scan %s: %d objects with VSI-Bench categories; none excluded",
            scene.dataset,
            scene.scene_id,
            len(scene.objects),
        )


# ---------------------------------------------------------------------------- PLY
_PLY_TYPES = {
    "char": "i1",
    "int8": "i1",
    "uchar": "u1",
    "uint8": "u1",
    "short": "i2",
    "int16": "i2",
    "ushort": "u2",
    "uint16": "u2",
    "int": "i4",
    "int32": "i4",
    "uint": "u4",
    "uint32": "u4",
    "float": "f4",
    "float32": "f4",
    "double": "f8",
    "float64": "f8",
}


# Largest side of a real indoor scan's bounding box: beyond it a stray vertex (or another unit) would
# make surface_points subdivide huge triangles without end.
MAX_SCAN_EXTENT_M = 200.0


def read_ply_mesh(path: str | Path) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """Read a triangle mesh from an ASCII or binary PLY file.

    Returns:
        ``(vertices (V, 3) float64, triangles (F, 3) int64, colors (V, 3) float64 in [0, 1] or None)``.
        Polygons with more than three corners are fan-triangulated.

    Raises:
        SceneLoadError: the file is missing, truncated or not a PLY triangle mesh.
    """
    path = Path(path)
    if not path.is_file():
        raise SceneLoadError(f"mesh file {str(path)!r} does not exist")
    data = path.read_bytes()
    end = data.find(b"end_header")
    if not data.startswith(b"ply") or end < 0:
        raise SceneLoadError(f"{str(path)!r} is not a PLY file (no 'ply' magic or no 'end_header')")
    newline = data.find(b"\n", end)
    if newline < 0:
        raise SceneLoadError(f"{str(path)!r}: PLY file ends right after its header (truncated)")
    body_start = newline + 1
    header = data[:end].decode("ascii", errors="replace").splitlines()
    fmt = None
    elements: list[dict[str, Any]] = []
    for number, line in enumerate(header[1:], start=2):
        tok = line.split()
        if not tok or tok[0] in ("comment", "obj_info"):
            continue
        try:
            if tok[0] == "format":
                fmt = tok[1]
            elif tok[0] == "element":
                count = int(tok[2])
                if count < 0:
                    raise ValueError(f"negative count {count}")
                elements.append({"name": tok[1], "count": count, "props": []})
            elif tok[0] == "property":
                if not elements:
                    raise SceneLoadError(f"{str(path)!r}: PLY property before any element")
                if tok[1] == "list":
                    elements[-1]["props"].append((tok[4], "list", _ply_type(path, tok[2]), _ply_type(path, tok[3])))
                else:
                    elements[-1]["props"].append((tok[2], _ply_type(path, tok[1]), None, None))
        except (IndexError, ValueError) as e:
            raise SceneLoadError(
                f"{str(path)!r}: PLY header line {number} {line.strip()!r} is malformed ({type(e).__name__}: {e})"
            ) from e
    if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
        raise SceneLoadError(f"{str(path)!r}: unsupported PLY format {fmt!r}")
    try:
        if fmt == "ascii":
            parsed = _read_ply_ascii(data[body_start:], elements)
        else:
            parsed = _read_ply_binary(data[body_start:], elements, "<" if fmt == "binary_little_endian" else ">")
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as e:
        raise SceneLoadError(f"{str(path)!r}: PLY body is truncated or malformed ({type(e).__name__}: {e})") from e
    if "vertex" not in parsed or "face" not in parsed:
        raise SceneLoadError(f"{str(path)!r}: PLY needs 'vertex' and 'face' elements, found {list(parsed)}")
    vert = parsed["vertex"]
    try:
        vertices = np.stack([np.asarray(vert[k], dtype=np.float64) for k in ("x", "y", "z")], axis=1)
    except KeyError as e:
        raise SceneLoadError(f"{str(path)!r}: vertex element lacks property {e}") from e
    except (ValueError, TypeError) as e:
        raise SceneLoadError(f"{str(path)!r}: vertex coordinates are malformed ({e})") from e
    if not np.isfinite(vertices).all():
        bad = int(np.flatnonzero(~np.isfinite(vertices).all(axis=1))[0])
        raise SceneLoadError(f"{str(path)!r}: vertex {bad} is not finite ({vertices[bad].tolist()})")
    if len(vertices) and float(np.ptp(vertices, axis=0).max()) > MAX_SCAN_EXTENT_M:
        raise SceneLoadError(
            f"{str(path)!r}: the mesh spans {float(np.ptp(vertices, axis=0).max()):.0f} m; indoor scans span < "
            f"{MAX_SCAN_EXTENT_M:.0f} m "
            "(a stray vertex far away, or units other than meters)"
        )
    colors = None
    if all(k in vert for k in ("red", "green", "blue")):
        raw = np.stack([np.asarray(vert[k]) for k in ("red", "green", "blue")], axis=1)
        colors = raw.astype(np.float64) / (255.0 if np.issubdtype(raw.dtype, np.integer) else 1.0)
    face = parsed["face"]
    key = "vertex_indices" if "vertex_indices" in face else "vertex_index" if "vertex_index" in face else None
    if key is None:
        raise SceneLoadError(f"{str(path)!r}: face element lacks 'vertex_indices'")
    try:
        triangles = _fan(face[key])
    except (ValueError, TypeError, IndexError) as e:
        raise SceneLoadError(f"{str(path)!r}: face lists are malformed ({e})") from e
    if len(triangles) and (triangles.min() < 0 or triangles.max() >= len(vertices)):
        raise SceneLoadError(f"{str(path)!r}: face indices out of range [0, {len(vertices)})")
    return vertices, triangles, colors


def _ply_type(path: Path, name: str) -> str:
    if name not in _PLY_TYPES:
        raise SceneLoadError(f"{str(path)!r}: unknown PLY type {name!r}")
    return _PLY_TYPES[name]


def _fan(faces: list[np.ndarray] | np.ndarray) -> np.ndarray:
    """Triangles (F, 3) from fixed-size (F, k) faces or a list of index arrays."""
    if isinstance(faces, np.ndarray) and faces.ndim == 2:
        k = faces.shape[1]
        if k < 3:
            raise ValueError(f"faces with {k} corners")
        return (
            np.concatenate([faces[:, [0, i, i + 1]] for i in range(1, k - 1)]).astype(np.int64)
            if len(faces)
            else np.zeros((0, 3), np.int64)
        )
    tris = [[f[0], f[i], f[i + 1]] for f in faces for i in range(1, len(f) - 1)]
    return np.asarray(tris, dtype=np.int64).reshape(-1, 3)


def _read_ply_ascii(body: bytes, elements: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    lines = body.decode("ascii").split("\n")
    pos = 0
    out: dict[str, dict[str, Any]] = {}
    for el in elements:
        n = el["count"]
        rows = [ln.split() for ln in lines[pos : pos + n]]
        if len(rows) < n:
            raise ValueError(f"element {el['name']} expects {n} lines, found {len(rows)}")
        pos += n
        has_list = any(p[1] == "list" for p in el["props"])
        if not has_list:
            arr = np.asarray(rows, dtype=np.float64).reshape(n, len(el["props"]))
            out[el["name"]] = {p[0]: arr[:, i].astype(p[1]) for i, p in enumerate(el["props"])}
            continue
        values: dict[str, Any] = {p[0]: [] for p in el["props"]}
        for row in rows:
            i = 0
            for name, kind, _, _ in el["props"]:
                if kind == "list":
                    k = int(row[i])
                    values[name].append(np.asarray(row[i + 1 : i + 1 + k], dtype=np.int64))
                    if len(values[name][-1]) != k:
                        raise ValueError(f"face list shorter than its count {k}")
                    i += 1 + k
                else:
                    values[name].append(float(row[i]))
                    i += 1
        out[el["name"]] = _stack_lists(values)
    return out


def _stack_lists(values: dict[str, list]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in values.items():
        if v and isinstance(v[0], np.ndarray):
            lengths = {len(a) for a in v}
            out[name] = np.stack(v) if len(lengths) == 1 else v
        else:
            out[name] = np.asarray(v)
    return out


def _read_ply_binary(body: bytes, elements: list[dict[str, Any]], endian: str) -> dict[str, dict[str, Any]]:
    pos = 0
    out: dict[str, dict[str, Any]] = {}
    for el in elements:
        n = el["count"]
        props = el["props"]
        if not any(p[1] == "list" for p in props):
            dt = np.dtype([(p[0], endian + p[1]) for p in props])
            if pos + n * dt.itemsize > len(body):
                raise ValueError(f"element {el['name']} needs {n * dt.itemsize} bytes, {len(body) - pos} left")
            arr = np.frombuffer(body, dtype=dt, count=n, offset=pos)
            pos += n * dt.itemsize
            out[el["name"]] = {p[0]: arr[p[0]] for p in props}
            continue
        # Fast path: one list property whose count is the same for every row (triangle meshes).
        if len(props) == 1 and n > 0:
            name, _, count_t, item_t = props[0]
            count_dt = np.dtype(endian + count_t)
            if pos + count_dt.itemsize > len(body):
                raise ValueError("face element truncated")
            k = int(np.frombuffer(body, dtype=count_dt, count=1, offset=pos)[0])
            dt = np.dtype([("n", count_dt), ("idx", endian + item_t, (k,))])
            if pos + n * dt.itemsize <= len(body):
                arr = np.frombuffer(body, dtype=dt, count=n, offset=pos)
                if np.all(arr["n"] == k):
                    out[el["name"]] = {name: arr["idx"].astype(np.int64)}
                    pos += n * dt.itemsize
                    continue
        values: dict[str, list] = {p[0]: [] for p in props}
        for _ in range(n):
            for name, kind, count_t, item_t in props:
                if kind == "list":
                    cdt = np.dtype(endian + count_t)
                    idt = np.dtype(endian + item_t)
                    if pos + cdt.itemsize > len(body):
                        raise ValueError(f"element {el['name']} truncated")
                    k = int(np.frombuffer(body, dtype=cdt, count=1, offset=pos)[0])
                    pos += cdt.itemsize
                    if pos + k * idt.itemsize > len(body):
                        raise ValueError(f"element {el['name']} truncated")
                    values[name].append(np.frombuffer(body, dtype=idt, count=k, offset=pos).astype(np.int64))
                    pos += k * idt.itemsize
                else:
                    dt = np.dtype(endian + kind)
                    if pos + dt.itemsize > len(body):
                        raise ValueError(f"element {el['name']} truncated")
                    values[name].append(np.frombuffer(body, dtype=dt, count=1, offset=pos)[0])
                    pos += dt.itemsize
        out[el["name"]] = _stack_lists(values)
    return out


# ---------------------------------------------------------------------------- shared geometry
def convex_hull_2d(points: np.ndarray) -> np.ndarray:
    """Counter-clockwise convex hull (H, 2) of 2-D points (Andrew's monotone chain)."""
    pts = np.unique(np.asarray(points, dtype=np.float64).reshape(-1, 2), axis=0)
    if len(pts) < 3:
        raise ValueError(f"need >= 3 distinct points for a hull, got {len(pts)}")

    def half(seq: np.ndarray) -> list[np.ndarray]:
        h: list[np.ndarray] = []
        for p in seq:
            while (
                len(h) >= 2
                and (h[-1][0] - h[-2][0]) * (p[1] - h[-2][1]) - (h[-1][1] - h[-2][1]) * (p[0] - h[-2][0]) <= 0
            ):
                h.pop()
            h.append(p)
        return h

    lower = half(pts)
    upper = half(pts[::-1])
    return np.array(lower[:-1] + upper[:-1])


def _finish_scene(
    scene_id: str,
    dataset: str,
    vertices: np.ndarray,
    triangles: np.ndarray,
    vertex_colors: Optional[np.ndarray],
    triangle_object_ids: np.ndarray,
    objects: list[SceneObject],
    source: Path,
    excluded: Optional[Counter] = None,
) -> Scene:
    """Shift the floor to z = 0, outline the floor and assemble the Scene (with ``excluded_labels``)."""
    if len(vertices) < 3 or len(triangles) == 0:
        raise SceneLoadError(f"{str(source)!r}: mesh is empty ({len(vertices)} vertices, {len(triangles)} faces)")
    floor_z = float(np.percentile(vertices[:, 2], FLOOR_PERCENTILE))
    vertices = vertices - np.array([0.0, 0.0, floor_z])
    for o in objects:
        o.center = o.center - np.array([0.0, 0.0, floor_z])
    ceiling = float(np.percentile(vertices[:, 2], CEILING_PERCENTILE))
    if ceiling <= 0:
        raise SceneLoadError(f"{str(source)!r}: mesh is flat (no height above the floor)")
    low = vertices[vertices[:, 2] < FLOOR_BAND, :2]
    try:
        polygon = convex_hull_2d(low if len(np.unique(low, axis=0)) >= 3 else vertices[:, :2])
    except ValueError as e:
        raise SceneLoadError(f"{str(source)!r}: cannot outline the floor ({e})") from e
    occupancy = build_occupancy(vertices, triangles, polygon)
    if vertex_colors is None:
        tri_colors = np.full((len(triangles), 3), 0.7)
    else:
        tri_colors = vertex_colors[triangles].mean(axis=1)
    excluded = excluded if excluded is not None else Counter()
    scene = Scene(
        scene_id,
        dataset,
        vertices,
        triangles,
        tri_colors,
        triangle_object_ids,
        objects,
        polygon,
        ceiling,
        occupancy,
        excluded_labels=dict(sorted(excluded.items())),
    )
    _log_exclusions(scene, excluded)
    return scene


def surface_points(vertices: np.ndarray, triangles: np.ndarray, spacing: float) -> np.ndarray:
    """Points (N, 3) on the mesh surface no farther than about ``spacing`` apart.

    Corners and centroids of every triangle, with triangles longer than ``spacing`` split into four
    (edge midpoints) until they are not; decimated scan meshes have large wall triangles whose corners
    alone would leave the wall invisible to a raster.
    """
    tris = vertices[triangles]
    out = [tris.reshape(-1, 3), tris.mean(axis=1)]
    while len(tris):
        edges = np.stack([tris[:, 1] - tris[:, 0], tris[:, 2] - tris[:, 1], tris[:, 0] - tris[:, 2]], axis=1)
        tris = tris[np.linalg.norm(edges, axis=2).max(axis=1) > spacing]
        if not len(tris):
            break
        a, b, c = tris[:, 0], tris[:, 1], tris[:, 2]
        ab, bc, ca = (a + b) / 2, (b + c) / 2, (c + a) / 2
        tris = np.concatenate([np.stack(t, axis=1) for t in ((a, ab, ca), (ab, b, bc), (ca, bc, c), (ab, bc, ca))])
        out += [ab, bc, ca, tris.mean(axis=1)]
    return np.concatenate(out)


def _dilate(mask: np.ndarray, k: int) -> np.ndarray:
    """Binary dilation by a (2k+1)^2 square (separable max filter by shifts)."""
    out = mask.copy()
    for axis in (0, 1):
        src = out.copy()
        n = src.shape[axis]
        for s in range(1, k + 1):
            if s >= n:
                break
            lo = [slice(None)] * 2
            hi = [slice(None)] * 2
            lo[axis], hi[axis] = slice(0, n - s), slice(s, n)
            out[tuple(hi)] |= src[tuple(lo)]
            out[tuple(lo)] |= src[tuple(hi)]
    return out


def build_occupancy(vertices: np.ndarray, triangles: np.ndarray, polygon: np.ndarray) -> OccupancyGrid:
    """Walkability raster of a scan whose floor is at z = 0 (see :class:`~.scene.OccupancyGrid`).

    A cell is walkable when scanned floor (surface below ``FLOOR_BAND``) lies in it, after a
    closing of ``OCC_CLOSE_CELLS`` cells, and no surface lies in it between ``OCC_MIN_Z`` and
    ``OCC_MAX_Z`` (an agent passes under a table top only if that top is above body height).
    """
    pts = surface_points(vertices, triangles, OCC_CELL)
    origin = polygon.min(axis=0) - 2 * OCC_CELL
    size = np.ceil((polygon.max(axis=0) + 2 * OCC_CELL - origin) / OCC_CELL).astype(int)
    nx, ny = int(size[0]), int(size[1])

    def raster(sel: np.ndarray) -> np.ndarray:
        ij = np.floor((pts[sel, :2] - origin) / OCC_CELL).astype(np.int64)
        ok = (ij[:, 0] >= 0) & (ij[:, 0] < nx) & (ij[:, 1] >= 0) & (ij[:, 1] < ny)
        grid = np.zeros((ny, nx), dtype=bool)
        grid[ij[ok, 1], ij[ok, 0]] = True
        return grid

    floor = raster(pts[:, 2] < FLOOR_BAND)
    floor = ~_dilate(~_dilate(floor, OCC_CLOSE_CELLS), OCC_CLOSE_CELLS)  # closing: dilate, then erode
    obstacle = raster((pts[:, 2] >= OCC_MIN_Z) & (pts[:, 2] <= OCC_MAX_Z))
    return OccupancyGrid(origin, OCC_CELL, ~floor | obstacle)


def _load_json(path: Path) -> Any:
    if not path.is_file():
        raise SceneLoadError(f"file {str(path)!r} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SceneLoadError(f"{str(path)!r} is not valid JSON: {e}") from e


# ---------------------------------------------------------------------------- ScanNet
def read_axis_alignment(path: str | Path) -> np.ndarray:
    """The 4x4 ``axisAlignment`` matrix (row-major in the file) from a ScanNet ``<scene>.txt``."""
    path = Path(path)
    if not path.is_file():
        raise SceneLoadError(f"ScanNet meta file {str(path)!r} does not exist")
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = re.match(r"\s*axisAlignment\s*=\s*(.*)", line)
        if m:
            try:
                values = [float(v) for v in m.group(1).split()]
            except ValueError as e:
                raise SceneLoadError(f"{str(path)!r}: axisAlignment has a non-number: {e}") from e
            if len(values) != 16:
                raise SceneLoadError(f"{str(path)!r}: axisAlignment needs 16 numbers, got {len(values)}")
            return np.asarray(values).reshape(4, 4)
    raise SceneLoadError(
        f"{str(path)!r} has no 'axisAlignment = ...' line (ScanNet test scenes lack it; use a train/val scene)"
    )


def _majority_ids(vertex_obj: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Per triangle, the object id held by at least two of its vertices (-1 when all three differ)."""
    t = vertex_obj[triangles]
    return np.where((t[:, 0] == t[:, 1]) | (t[:, 0] == t[:, 2]), t[:, 0], np.where(t[:, 1] == t[:, 2], t[:, 1], -1))


def _read_seg_indices(path: Path, num_vertices: int, mesh: Path) -> np.ndarray:
    """``segIndices`` of a ScanNet/ScanNet++ segments file: one integer per mesh vertex."""
    segs = _load_json(path)
    try:
        raw = np.asarray(segs["segIndices"])
        if raw.ndim != 1 or not (np.issubdtype(raw.dtype, np.integer) or raw.size == 0):
            raise ValueError(f"found {raw.dtype} values of shape {raw.shape}")
        seg_indices = raw.astype(np.int64)
    except (KeyError, TypeError, ValueError) as e:
        raise SceneLoadError(f"{str(path)!r}: expected a 'segIndices' list of integers ({e})") from e
    if len(seg_indices) != num_vertices:
        raise SceneLoadError(
            f"{str(path)!r}: {len(seg_indices)} segIndices for {num_vertices} mesh vertices in {str(mesh)!r}"
        )
    return seg_indices


def _scene_files(scene_dir: Path, names: list[str], root: Optional[str | Path]) -> list[Path]:
    """``scene_dir / name`` for each name; with ``root``, each must resolve inside it (a link in the
    scene's directory may not lead out of the data root)."""
    paths = [scene_dir / n for n in names]
    if root is not None:
        try:
            paths = [inside(root, p, f"scene {scene_dir.name!r}") for p in paths]
        except PathOutsideRoot as e:
            raise SceneLoadError(str(e)) from None
    return paths


def load_scannet_scene(
    scene_dir: str | Path, scene_name: Optional[str] = None, root: Optional[str | Path] = None
) -> Scene:
    """Load a ScanNet scene directory (see the module docstring for the files and conventions).

    Args:
        scene_dir: Directory holding the scene's files.
        scene_name: Scene id such as ``scene0011_00``; defaults to the directory name.
        root: The data root every file read must resolve into (links followed); None: not checked.
    """
    scene_dir = Path(scene_dir)
    name = scene_name or scene_dir.name
    ply, segs_path, agg_path, meta_path = _scene_files(
        scene_dir,
        [f"{name}_vh_clean_2.ply", f"{name}_vh_clean_2.0.010000.segs.json", f"{name}.aggregation.json", f"{name}.txt"],
        root,
    )
    vertices, triangles, colors = read_ply_mesh(ply)
    align = read_axis_alignment(meta_path)
    agg = _load_json(agg_path)
    seg_indices = _read_seg_indices(segs_path, len(vertices), ply)
    try:
        groups = [
            (int(g["objectId"]), clean_label(g["label"]), [int(s) for s in g["segments"]]) for g in agg["segGroups"]
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise SceneLoadError(f"{str(agg_path)!r}: expected 'segGroups' with objectId, label, segments ({e})") from e
    ids = [oid for oid, _, _ in groups]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SceneLoadError(f"{str(agg_path)!r}: objectId {dup} appears in more than one segGroup")

    vertices = vertices @ align[:3, :3].T + align[:3, 3]
    # Benchmark categories; structure and excluded groups keep their segments unassigned (-1).
    labels = label_map("scannet")
    excluded: Counter = Counter()
    kept: list[tuple[int, str, list[int]]] = []
    for oid, raw, segments in groups:
        status, category = labels.lookup(raw)
        if status == "mapped":
            kept.append((oid, category, segments))
        elif status == "excluded":
            excluded[raw] += 1
    # Per-vertex object id via a segment -> object lookup table.
    seg_to_obj: dict[int, int] = {}
    for oid, _, segments in kept:
        for s in segments:
            seg_to_obj[s] = oid
    uniq, inverse = np.unique(seg_indices, return_inverse=True)
    vertex_obj = np.array([seg_to_obj.get(int(s), -1) for s in uniq], dtype=np.int64)[inverse]
    tri_obj = _majority_ids(vertex_obj, triangles)

    objects: list[SceneObject] = []
    for oid, label, _ in kept:
        pts = vertices[vertex_obj == oid]
        if len(pts) == 0:
            continue  # documented: objects without vertices are dropped
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        objects.append(SceneObject(oid, label, (lo + hi) / 2.0, hi - lo, np.eye(3)))
    kept = {o.object_id for o in objects}
    tri_obj = np.where(np.isin(tri_obj, list(kept)), tri_obj, -1) if kept else np.full(len(tri_obj), -1)
    return _finish_scene(name, "scannet", vertices, triangles, colors, tri_obj, objects, ply, excluded)


# ---------------------------------------------------------------------------- ARKitScenes
def load_arkitscenes_scene(
    scene_dir: str | Path, video_id: Optional[str] = None, root: Optional[str | Path] = None
) -> Scene:
    """Load an ARKitScenes 3DOD scene directory (see the module docstring).

    Args:
        scene_dir: Directory holding ``<video_id>_3dod_mesh.ply`` and ``<video_id>_3dod_annotation.json``.
        video_id: Defaults to the directory name.
        root: The data root every file read must resolve into (links followed); None: not checked.
    """
    scene_dir = Path(scene_dir)
    vid = video_id or scene_dir.name
    ply, ann_path = _scene_files(scene_dir, [f"{vid}_3dod_mesh.ply", f"{vid}_3dod_annotation.json"], root)
    vertices, triangles, colors = read_ply_mesh(ply)
    ann = _load_json(ann_path)
    objects: list[SceneObject] = []
    try:
        entries = ann["data"]
        for i, entry in enumerate(entries):
            obb = entry["segments"]["obbAligned"]
            axes = np.asarray(obb["normalizedAxes"], dtype=np.float64).reshape(3, 3)
            objects.append(
                SceneObject(
                    i,
                    clean_label(entry["label"]),
                    np.asarray(obb["centroid"], dtype=np.float64).reshape(3),
                    np.asarray(obb["axesLengths"], dtype=np.float64).reshape(3),
                    axes.T,
                )
            )
    except (KeyError, TypeError, ValueError) as e:
        raise SceneLoadError(
            f"{str(ann_path)!r}: expected 'data' entries with label and segments.obbAligned "
            f"{{centroid, axesLengths, normalizedAxes}} ({type(e).__name__}: {e})"
        ) from e

    for o in objects:
        if not (np.isfinite(o.center).all() and np.isfinite(o.extent).all() and np.isfinite(o.rotation).all()):
            raise SceneLoadError(
                f"{str(ann_path)!r}: object {o.object_id} ({o.label}) has a non-finite box (centroid "
                f"{o.center.tolist()})"
            )
    labels = label_map("arkitscenes")
    excluded: Counter = Counter()
    boxes: list[SceneObject] = []  # kept and excluded: an excluded box still claims its own triangles
    excluded_ids: list[int] = []
    for o in objects:
        status, category = labels.lookup(o.label)
        if status == "structure":
            continue
        if status == "excluded":
            excluded[o.label] += 1
            excluded_ids.append(o.object_id)
        else:
            o.label = category
        boxes.append(o)
    centroids = vertices[triangles].mean(axis=1)
    tri_obj = np.full(len(triangles), -1, dtype=np.int64)
    # Largest boxes first so that smaller boxes inside them overwrite: the smallest box wins.
    for o in sorted(boxes, key=lambda o: -float(np.prod(o.extent))):
        local = (centroids - o.center) @ o.rotation
        inside = np.all(np.abs(local) <= o.extent / 2.0 + BOX_MARGIN, axis=1)
        tri_obj[inside] = o.object_id
    tri_obj[np.isin(tri_obj, excluded_ids)] = -1
    dropped = set(excluded_ids)
    kept = [o for o in boxes if o.object_id not in dropped]
    return _finish_scene(vid, "arkitscenes", vertices, triangles, colors, tri_obj, kept, ply, excluded)


# ---------------------------------------------------------------------------- ScanNet++
SCANNETPP_FILES = ("mesh_aligned_0.05.ply", "segments.json", "segments_anno.json")


def load_scannetpp_scene(
    scene_dir: str | Path, scene_id: Optional[str] = None, root: Optional[str | Path] = None
) -> Scene:
    """Load a ScanNet++ scene directory (see the module docstring).

    Args:
        scene_dir: ``<data>/<scene_id>``, holding ``scans/`` with :data:`SCANNETPP_FILES`.
        scene_id: Defaults to the directory name.
        root: The data root every file read must resolve into (links followed); None: not checked.
    """
    scene_dir = Path(scene_dir)
    sid = scene_id or scene_dir.name
    ply, segs_path, anno_path = _scene_files(scene_dir / "scans", list(SCANNETPP_FILES), root)
    vertices, triangles, colors = read_ply_mesh(ply)
    anno = _load_json(anno_path)
    seg_indices = _read_seg_indices(segs_path, len(vertices), ply)
    try:
        groups = [
            (int(g["objectId"]), clean_label(g["label"]), [int(s) for s in g["segments"]], g.get("obb"))
            for g in anno["segGroups"]
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SceneLoadError(
            f"{str(anno_path)!r}: expected 'segGroups' with objectId, label, segments ({type(e).__name__}: {e})"
        ) from e
    ids = [oid for oid, *_ in groups]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SceneLoadError(f"{str(anno_path)!r}: objectId {dup} appears in more than one segGroup")
    if any(oid < 0 for oid in ids):
        raise SceneLoadError(f"{str(anno_path)!r}: objectId {min(ids)} is negative; object ids are >= 0")

    labels = label_map("scannetpp")
    excluded: Counter = Counter()
    status = {oid: labels.lookup(raw) for oid, raw, _, _ in groups}
    for oid, raw, _, _ in groups:
        if status[oid][0] == "excluded":
            excluded[raw] += 1
    # Each unique segment goes to the smallest non-structure group holding it: groups are applied
    # largest first, so a smaller one overwrites (ScanNet++'s single-label rule for overlaps).
    uniq, inverse = np.unique(seg_indices, return_inverse=True)
    seg_size = np.bincount(inverse, minlength=len(uniq))
    members: dict[int, np.ndarray] = {}
    for oid, _, segments, _ in groups:
        if status[oid][0] == "structure":
            continue
        segs = np.unique(np.asarray(segments, dtype=np.int64))
        pos = np.searchsorted(uniq, segs)
        found = pos < len(uniq)
        found[found] = uniq[pos[found]] == segs[found]  # segments no vertex has are ignored
        members[oid] = pos[found]
    seg_owner = np.full(len(uniq), -1, dtype=np.int64)
    for oid in sorted(members, key=lambda o: (-int(seg_size[members[o]].sum()), o)):
        seg_owner[members[oid]] = oid
    vertex_obj = seg_owner[inverse]
    dropped = [oid for oid, (st, _) in status.items() if st != "mapped"]
    vertex_obj[np.isin(vertex_obj, dropped)] = -1

    objects: list[SceneObject] = []
    for oid, _, _, obb in groups:
        st, category = status[oid]
        if st != "mapped":
            continue
        try:
            if obb is not None:
                axes = np.asarray(obb["normalizedAxes"], dtype=np.float64).reshape(3, 3)
                obj = SceneObject(
                    oid,
                    category,
                    np.asarray(obb["centroid"], dtype=np.float64).reshape(3),
                    np.asarray(obb["axesLengths"], dtype=np.float64).reshape(3),
                    axes.T,
                )
                if not np.isfinite(obj.center).all():
                    raise ValueError(f"centroid {obj.center.tolist()} is not finite")
            else:
                pts = vertices[vertex_obj == oid]
                if len(pts) == 0:
                    continue  # documented: no box and no vertices
                lo, hi = pts.min(axis=0), pts.max(axis=0)
                obj = SceneObject(oid, category, (lo + hi) / 2.0, hi - lo, np.eye(3))
        except (KeyError, TypeError, ValueError) as e:
            raise SceneLoadError(
                f"{str(anno_path)!r}: object {oid} ({category}) has a malformed obb; expected centroid, axesLengths "
                "and a "
                f"rotation normalizedAxes ({type(e).__name__}: {e})"
            ) from e
        objects.append(obj)
    kept = {o.object_id for o in objects}
    tri_obj = _majority_ids(vertex_obj, triangles)
    tri_obj = np.where(np.isin(tri_obj, list(kept)), tri_obj, -1) if kept else np.full(len(tri_obj), -1)
    return _finish_scene(sid, "scannetpp", vertices, triangles, colors, tri_obj, objects, ply, excluded)


# ---------------------------------------------------------------------------- lookup
# A file every scan of a dataset has once: its name (or, for ScanNet++, its directory) names the scan.
SCAN_MARKERS = {
    "scannet": "*_vh_clean_2.ply",
    "arkitscenes": "*_3dod_mesh.ply",
    "scannetpp": "scans/mesh_aligned_0.05.ply",
}


def find_scan_names(data_root: str | Path, dataset: str) -> list[str]:
    """Names of the scans of ``dataset`` anywhere under ``data_root``, found by :data:`SCAN_MARKERS`, sorted.

    Raises:
        SceneLoadError: An unknown dataset.
        FileNotFoundError: No scan found (the message names the file looked for).
    """
    if dataset not in SCAN_MARKERS:
        raise SceneLoadError(f"unknown scan dataset {dataset!r}; known: {sorted(SCAN_MARKERS)}")
    pattern = SCAN_MARKERS[dataset]
    if dataset == "scannetpp":
        names = {p.parent.parent.name for p in Path(data_root).rglob(Path(pattern).name) if p.parent.name == "scans"}
    else:
        names = {p.name[: -len(pattern) + 1] for p in Path(data_root).rglob(pattern)}
    if not names:
        raise FileNotFoundError(f"no {dataset} scans ({pattern}) found under {str(data_root)!r}")
    return sorted(names)


def scene_candidates(data_root: str | Path, dataset: str, scene_name: str) -> list[Path]:
    """The directories :func:`find_scene` tries, in order (see there)."""
    root = Path(data_root)
    candidates = [
        root / scene_name,
        root / "scans" / scene_name,
        root / "data" / scene_name,
        root / dataset / scene_name,
        root / dataset / "scans" / scene_name,
        root / dataset / "data" / scene_name,
    ]
    for split in ("Validation", "Training", "val", "train"):
        candidates += [
            root / split / scene_name,
            root / "3dod" / split / scene_name,
            root / dataset / split / scene_name,
            root / dataset / "3dod" / split / scene_name,
        ]
    return candidates


def find_scene(data_root: str | Path, dataset: str, scene_name: str) -> Scene:
    """Find and load a scan under ``data_root``.

    Looked-up directories: ``<root>/<name>``, ``<root>/scans/<name>`` (ScanNet), ``<root>/data/<name>``
    (ScanNet++), ``<root>/<split>/<name>`` and ``<root>/3dod/<split>/<name>`` (ARKitScenes'
    Training/Validation), and each of these under ``<root>/<dataset>/`` too. The name comes from data
    (a benchmark row): it must be one path component, and the directory and every file read must
    resolve inside ``data_root``, symbolic links followed.

    Raises:
        SceneLoadError: unknown dataset, a name or a link that leads out of ``data_root``, or no
            directory found (the message lists where it looked).
    """
    root = Path(data_root)
    loaders = {"scannet": load_scannet_scene, "arkitscenes": load_arkitscenes_scene, "scannetpp": load_scannetpp_scene}
    if dataset not in loaders:
        raise SceneLoadError(f"unknown dataset {dataset!r} for scene {scene_name!r}; known: {sorted(loaders)}")
    problem = plain_name_problem(scene_name)
    if problem:
        raise SceneLoadError(
            f"{dataset} scene name {scene_name[:80]!r} {problem}; a scene is named like scene0011_00, 41069025 or "
            "3db0a1c8f3"
        )
    candidates = scene_candidates(root, dataset, scene_name)
    for c in candidates:
        if c.is_dir():
            try:
                inside(root, c, f"{dataset} scene {scene_name!r}")
            except PathOutsideRoot as e:
                raise SceneLoadError(str(e)) from None
            return loaders[dataset](c, scene_name, root=root)
    raise SceneLoadError(
        f"{dataset} scene {scene_name!r} not found under {str(root)!r}; looked in: "
        + ", ".join(str(c) for c in candidates)
    )
