#!/usr/bin/env python
"""Regenerate the raw-label -> VSI-Bench category tables in ``a2c_ppo_acktr/envs/data/``.

Real scans label objects in their own words ("office chair", "kitchen cabinets", "tv_monitor"); the
benchmark's questions use a curated, remapped vocabulary ("chair", "cabinet", "tv"). This script
writes the four tables the loaders in ``a2c_ppo_acktr/envs/real_scans.py`` read:

* ``vsibench_categories.tsv``: the benchmark vocabulary, one category per row with its evidence;
* ``scannet_labels.tsv``: every ``raw_category`` of ScanNet's label table -> status + category;
* ``arkitscenes_labels.tsv``: the 17 ARKitScenes 3DOD classes -> status + category;
* ``scannetpp_labels.tsv``: the 84 ScanNet++ instance classes the benchmark draws from -> status +
  category (the loader excludes every raw label this table does not list).

Usage (from the repository root)::

    python scripts/make_label_maps.py            # write the tables
    python scripts/make_label_maps.py --check    # exit 1 when the committed tables are stale
    python scripts/make_label_maps.py --table PATH/scannetv2-labels.combined.tsv

Only the standard library is used. Without ``--table`` the ScanNet table is read from the copy the
``open3d`` wheel ships (``open3d/_ml3d/datasets/_resources/scannet/``, found without importing open3d).

Sources
-------
ScanNet label table ``scannetv2-labels.combined.tsv`` (ScanNet v2; distributed by ScanNet's download
script as ``LABEL_MAP_FILES``, not kept in the ScanNet/ScanNet git repository). The copy used is
byte-identical (SHA-256 below, 607 rows, 55,796 bytes) to

*
https://github.com/isl-org/Open3D-ML/blob/14684b3c809a4da4c0dd2e24460a1a7636fed6e3/ml3d/datasets/_resources/scannet/scannetv2-labels.combined.tsv
  (also shipped in the open3d 0.20.0 wheel, a dependency of this package);
*
https://github.com/open-mmlab/mmdetection3d/blob/f8226a2e117b30f21b26dc2aea02ee19c1379a36/data/scannet/meta_data/scannetv2-labels.combined.tsv
  holds the same rows (its ``furnace`` row has the two trailing empty mpcat40 fields the Open3D-ML
  copy lacks; no column used here differs).

Columns used: ``raw_category`` (the free-text label in ``<scene>.aggregation.json``), ``category``
(ScanNet's cleaned category; raw labels sharing it share ScanNet's ``id``, which is also the class id of
ScanNet200), ``nyu40class`` (walls/floors/ceilings are structure) and ``count`` (instances in ScanNet).

ARKitScenes 3DOD classes:
https://github.com/apple/ARKitScenes/blob/42a27f75a93fda8ecacf7453eacbbcb9be20693a/threedod/benchmark_scripts/utils/taxonomy.py
(``class_names``, 17 names).

The benchmark's vocabulary (VSI-Bench, "Thinking in Space", Yang et al. 2024; App. B.1: "we carefully
curate a subset of categories from the three source datasets ... exclude both rare categories and
those with extremely small object sizes ... implement category remapping"). The curation code itself
is not in nyu-visionx/thinking-in-space; the authors' per-dataset helpers were published with VLM-3R's
data pipeline (paths like ``/mnt/disks/sp-data/jihan/spbench_anno/...``), copied in:
https://github.com/Zhanpeng1202/SpatialReasoner/tree/cfeae6f7f5b93faaae439be0100d3b7dc74a297a/vlm_3r_data_process/src/utils

* ``arkitscenes_utils.py``: ``INVALID_CATES = [sink, shelf, oven, cabinet]`` and
  ``CATE_MAPPER = {"tv": ["tv_monitor"]}``: ARKitScenes objects of those four classes are never asked
  about, and ``tv_monitor`` is called **tv** (so ``tv_monitor -> tv``, not ``monitor``);
* ``scannetpp_utils.py``: ``SCANNETPP_INST_SEG_CATEGORY`` minus ``INVALID_CATES`` with ``CATE_MAPPER``
  (office chair -> chair, ceiling lamp -> ceiling light, mouse -> computer mouse; cabinets dropped).
  The authors' ScanNet++ metadata step (``metadata_generation/ScanNetpp/scannetpp_metadata.py`` in
  the same tree) keeps a ``segments_anno.json`` group only when its raw ``label`` is one of
  ``SCANNETPP_INST_SEG_CATEGORY`` as written, so the ScanNet++ table lists exactly those 84 names
  and no others (a few per-scene exceptions in ``magic_category_checker`` are not reproduced);
* ``scannetv2_utils.py``: ``SCANNETV2_VALID_CATEGORY_NAME`` (bed, chair, sofa, table, window,
  bookshelf, counter, desk, refrigerator) with ``SCANNET_CLASS_REMAPPER = {"table": ["desk", "table"]}``.
  Its ScanNet200 half (``scannet200_utils.py``: valid names and ``SCANNET200_CLASS_REMAPPER``) is not
  in any public copy found, so ScanNet names beyond the list above come from

* VSI-Bench ScanNet rows quoted in public evaluation logs: ``scene0664_02`` "If I am standing by the
  mirror and facing the door, is the trash bin to my ..."; ``scene0221_01`` "... which of these objects
  (chair, bed, pillow, lamp) is the closest to the microwave?"; ``scene0574_01`` "How many towel(s) are
  in this room?"; ``scene0307_02`` (door, window, radiator). ScanNet's "trash can" / "recycling bin"
  are therefore asked as **trash bin** (ScanNet++'s own "trash can" stays "trash can");
* the paper's figures: Fig. 1 "How many cabinet(s) are in this room?" (the only evidence for
  "cabinet", which the authors' code drops for ARKitScenes and ScanNet++).

Every category a table maps to is in ``vsibench_categories.tsv``; a ScanNet label maps only to a name
with such evidence. ScanNet names with no evidence (nightstand, dresser, tv stand, shelf, sink, oven,
backpack, ...) are *excluded*: the loader keeps their geometry but asks no question about them. To
change that, add the name to the evidence lists below (e.g. ``SCANNET_ROWS_SEEN``, with the row that
shows it), or a merge to ``CATEGORY_RULES``, and rerun; ``--check`` (run by tests/test_real_scans.py)
fails until the committed tables are regenerated.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import io
import sys
from collections import Counter
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "a2c_ppo_acktr" / "envs" / "data"
SCANNET_TABLE_SHA256 = "c226e119d0a92fb86b850eab765219c0c54e59419cc427a6b5643b7b5c989c7d"
SCANNET_TABLE_URL = (
    "https://github.com/isl-org/Open3D-ML/blob/14684b3c809a4da4c0dd2e24460a1a7636fed6e3/"
    "ml3d/datasets/_resources/scannet/scannetv2-labels.combined.tsv"
)
ARKIT_TAXONOMY_URL = (
    "https://github.com/apple/ARKitScenes/blob/42a27f75a93fda8ecacf7453eacbbcb9be20693a/"
    "threedod/benchmark_scripts/utils/taxonomy.py"
)
VSI_UTILS_URL = (
    "https://github.com/Zhanpeng1202/SpatialReasoner/tree/cfeae6f7f5b93faaae439be0100d3b7dc74a297a/"
    "vlm_3r_data_process/src/utils"
)

# --------------------------------------------------------------------------- the benchmark's lists
# Quoted from the sources above (data, not code of theirs).
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
ARKIT_INVALID = ["sink", "shelf", "oven", "cabinet"]
ARKIT_MAPPER = {"tv": ["tv_monitor"]}

SCANNETPP_INST_SEG_CATEGORY = [
    "table",
    "door",
    "ceiling lamp",
    "cabinet",
    "blinds",
    "curtain",
    "chair",
    "storage cabinet",
    "office chair",
    "bookshelf",
    "whiteboard",
    "window",
    "box",
    "monitor",
    "shelf",
    "heater",
    "kitchen cabinet",
    "sofa",
    "bed",
    "trash can",
    "book",
    "plant",
    "blanket",
    "tv",
    "computer tower",
    "refrigerator",
    "jacket",
    "sink",
    "bag",
    "picture",
    "pillow",
    "towel",
    "suitcase",
    "backpack",
    "crate",
    "keyboard",
    "rack",
    "toilet",
    "printer",
    "poster",
    "painting",
    "microwave",
    "shoes",
    "socket",
    "bottle",
    "bucket",
    "cushion",
    "basket",
    "shoe rack",
    "telephone",
    "file folder",
    "laptop",
    "plant pot",
    "exhaust fan",
    "cup",
    "coat hanger",
    "light switch",
    "speaker",
    "table lamp",
    "kettle",
    "smoke detector",
    "container",
    "power strip",
    "slippers",
    "paper bag",
    "mouse",
    "cutting board",
    "toilet paper",
    "paper towel",
    "pot",
    "clock",
    "pan",
    "tap",
    "jar",
    "soap dispenser",
    "binder",
    "bowl",
    "tissue box",
    "whiteboard eraser",
    "toilet brush",
    "spray bottle",
    "headphones",
    "stapler",
    "marker",
]
SCANNETPP_INVALID = [
    "binder",
    "poster",
    "blinds",
    "curtain",
    "window",
    "backpack",
    "bag",
    "book",
    "bottle",
    "box",
    "container",
    "jacket",
    "jar",
    "light switch",
    "marker",
    "painting",
    "paper towel",
    "poster",
    "plant pot",
    "pot",
    "shelf",
    "sink",
    "smoke detector",
    "soap dispenser",
    "socket",
    "speaker",
    "spray bottle",
    "tap",
    "tissue box",
    "toilet brush",
    "toilet paper",
    "towel",
    "whiteboard eraser",
    "cabinet",
    "kitchen cabinet",
    "storage cabinet",
]
SCANNETPP_MAPPER = {
    "cabinet": ["cabinet", "kitchen cabinet", "storage cabinet"],
    "chair": ["chair", "office chair"],
    "ceiling light": ["ceiling lamp"],
    "computer mouse": ["mouse"],
}

SCANNETV2_VALID = ["bed", "chair", "sofa", "table", "window", "bookshelf", "counter", "desk", "refrigerator"]
SCANNETV2_MAPPER = {"table": ["desk", "table"]}

SCANNET_ROWS_SEEN = [
    "trash bin",
    "mirror",
    "door",
    "lamp",
    "pillow",
    "microwave",
    "towel",
    "radiator",
    "window",
    "chair",
    "bed",
]
PAPER_FIGURES = ["cabinet"]


def _apply(names: list[str], invalid: list[str], mapper: dict[str, list[str]]) -> list[str]:
    inverse = {v: k for k, vs in mapper.items() for v in vs}
    return [inverse.get(n, n) for n in names if n not in invalid]


def vocabulary() -> dict[str, str]:
    """The benchmark's categories -> evidence (``;``-separated source tags)."""
    evidence: dict[str, list[str]] = {}
    sources = [
        ("arkitscenes", _apply(ARKIT_CLASSES, ARKIT_INVALID, ARKIT_MAPPER)),
        ("scannetpp", _apply(SCANNETPP_INST_SEG_CATEGORY, SCANNETPP_INVALID, SCANNETPP_MAPPER)),
        ("scannet-v2", _apply(SCANNETV2_VALID, [], SCANNETV2_MAPPER)),
        ("scannet-rows", SCANNET_ROWS_SEEN),
        ("paper-fig1", PAPER_FIGURES),
    ]
    for tag, names in sources:
        for n in names:
            tags = evidence.setdefault(n, [])
            if tag not in tags:
                tags.append(tag)
    return {n: ";".join(evidence[n]) for n in sorted(evidence)}


# --------------------------------------------------------------------------- ScanNet rules
STRUCTURE_NYU40 = {"wall", "floor", "ceiling"}
STRUCTURE_RAW = {"object"}  # ScanNet's "unlabelled object"; the loader treats it as structure already

# Reviewed merges, keyed on ScanNet's ``category`` column (raw labels sharing it share ScanNet's id).
# Each target must be in vocabulary(); the reason is written to the table's ``rule`` column.
CATEGORY_RULES: dict[str, tuple[Optional[str], str]] = {
    # chairs: ScanNet++ maps office chair -> chair; every nyu40class=chair category is a chair
    **{
        c: ("chair", "chair family (nyu40 chair; ScanNet++ office chair -> chair)")
        for c in (
            "office chair",
            "armchair",
            "sofa chair",
            "folded chair",
            "massage chair",
            "recliner chair",
            "rocking chair",
        )
    },
    "beanbag chair": ("chair", "chair family"),
    "couch": ("sofa", "nyu40 sofa"),
    # tables: SCANNET_CLASS_REMAPPER table <- desk; nyu40class=table categories (game tables aside)
    "desk": ("table", "SCANNET_CLASS_REMAPPER table <- desk"),
    **{
        c: ("table", "table family (nyu40 table)")
        for c in ("coffee table", "end table", "dining table", "side table", "round table", "folded table")
    },
    "air hockey table": (None, "game table, not a table"),
    "kitchen counter": ("counter", "counter family (nyu40 counter)"),
    "bathroom counter": ("counter", "counter family (nyu40 counter)"),
    # cabinets: ScanNet++'s mapper merges kitchen/storage cabinets into cabinet
    **{
        c: ("cabinet", "cabinet family (nyu40 cabinet; ScanNet++ mapper)")
        for c in ("kitchen cabinet", "file cabinet", "bathroom cabinet")
    },
    "bathroom vanity": (None, "cabinet with a sink and counter: ambiguous"),
    "trash cabinet": (None, "neither a cabinet nor a bin"),
    "cabinet door": (None, "part of a cabinet"),
    "media center": (None, "ambiguous furniture"),
    # ScanNet rows ask "trash bin"
    "trash can": ("trash bin", "VSI-Bench ScanNet rows say trash bin"),
    "recycling bin": ("trash bin", "VSI-Bench ScanNet rows say trash bin"),
    "mini fridge": ("refrigerator", "nyu40 refrigerator"),
    "washing machine": ("washer", "ARKitScenes' word"),
    "mouse": ("computer mouse", "ScanNet++ mapper mouse -> computer mouse"),
    "ceiling lamp": ("ceiling light", "ScanNet++ mapper ceiling lamp -> ceiling light"),
    "desk lamp": ("lamp", "lamp family (nyu40 lamp)"),
    "night lamp": ("lamp", "lamp family (nyu40 lamp)"),
    "potted plant": ("plant", "a plant"),
    "coffee kettle": ("kettle", "a kettle"),
    "tea kettle": ("kettle", "a kettle"),
    "alarm clock": ("clock", "a clock"),
    "mug": ("cup", "a cup"),
    "coffee mug": ("cup", "a cup"),
    "starbucks cup": ("cup", "a cup"),
    "frying pan": ("pan", "a pan"),
    "cooking pan": ("pan", "a pan"),
    "laundry basket": ("basket", "a basket"),
    "hand towel": ("towel", "nyu40 towel"),
    "shoe": ("shoes", "ScanNet++ says shoes"),
    "slipper": ("slippers", "ScanNet++ says slippers"),
    "stovetop": ("stove", "a stove"),
}
# Raw labels whose category would map but should not (reviewed).
RAW_RULES: dict[str, tuple[Optional[str], str]] = {}


def scannet_rows(table_text: str) -> list[dict[str, str]]:
    """The ScanNet table's rows with ``status``, ``vsibench_category`` and ``rule`` added."""
    vocab = vocabulary()
    rows = list(csv.DictReader(io.StringIO(table_text), delimiter="\t"))
    need = {"raw_category", "category", "count", "nyu40class"}
    if not rows or not need <= set(rows[0]):
        raise SystemExit(f"the ScanNet table needs columns {sorted(need)}, found {sorted(rows[0]) if rows else []}")
    for target, _ in list(CATEGORY_RULES.values()) + list(RAW_RULES.values()):
        if target is not None and target not in vocab:
            raise SystemExit(f"rule target {target!r} is not a benchmark category; add it to the evidence lists first")
    out = []
    for r in rows:
        raw, cat, nyu = r["raw_category"].strip(), r["category"].strip(), r["nyu40class"].strip()
        if raw in STRUCTURE_RAW or nyu in STRUCTURE_NYU40:
            status, target, rule = (
                "structure",
                "",
                f"nyu40class {nyu}" if nyu in STRUCTURE_NYU40 else "unlabelled object",
            )
        elif raw in RAW_RULES:
            t, why = RAW_RULES[raw]
            status, target, rule = ("mapped", t, why) if t else ("excluded", "", why)
        elif cat in CATEGORY_RULES:
            t, why = CATEGORY_RULES[cat]
            status, target, rule = ("mapped", t, why) if t else ("excluded", "", why)
        elif cat in vocab:
            status, target, rule = "mapped", cat, "category is a benchmark name"
        else:
            status, target, rule = "excluded", "", "no benchmark category"
        out.append(
            {
                "raw_category": raw,
                "category": cat,
                "nyu40class": nyu,
                "count": r["count"].strip(),
                "status": status,
                "vsibench_category": target,
                "rule": rule,
            }
        )
    return out


def scannetpp_rows() -> list[dict[str, str]]:
    """The benchmark's 84 ScanNet++ instance classes, each mapped (renamed by its mapper) or excluded."""
    inverse = {v: k for k, vs in SCANNETPP_MAPPER.items() for v in vs}
    out = []
    for c in SCANNETPP_INST_SEG_CATEGORY:
        if c in SCANNETPP_INVALID:
            out.append(
                {
                    "raw_label": c,
                    "status": "excluded",
                    "vsibench_category": "",
                    "rule": "VSI-Bench INVALID_CATES for ScanNet++",
                }
            )
        elif c in inverse:
            out.append(
                {
                    "raw_label": c,
                    "status": "mapped",
                    "vsibench_category": inverse[c],
                    "rule": f"VSI-Bench CATE_MAPPER {inverse[c]} <- {c}",
                }
            )
        else:
            out.append(
                {"raw_label": c, "status": "mapped", "vsibench_category": c, "rule": "ScanNet++ instance class name"}
            )
    return out


def arkit_rows() -> list[dict[str, str]]:
    inverse = {v: k for k, vs in ARKIT_MAPPER.items() for v in vs}
    out = []
    for c in ARKIT_CLASSES:
        if c in ARKIT_INVALID:
            out.append(
                {
                    "raw_label": c,
                    "status": "excluded",
                    "vsibench_category": "",
                    "rule": "VSI-Bench INVALID_CATES for ARKitScenes",
                }
            )
        elif c in inverse:
            out.append(
                {
                    "raw_label": c,
                    "status": "mapped",
                    "vsibench_category": inverse[c],
                    "rule": f"VSI-Bench CATE_MAPPER {inverse[c]} <- {c}",
                }
            )
        else:
            out.append({"raw_label": c, "status": "mapped", "vsibench_category": c, "rule": "3DOD class name"})
    return out


def _tsv(header_lines: list[str], columns: list[str], rows: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    for line in header_lines:
        buf.write(f"# {line}\n" if line else "#\n")
    w = csv.DictWriter(buf, fieldnames=columns, delimiter="\t", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


GENERATED = (
    "Generated by scripts/make_label_maps.py (its docstring has the sources and the reasoning); do not edit by hand."
)
COLUMNS = (
    "Columns: status is mapped (vsibench_category is the benchmark's name), excluded (no benchmark category: geometry "
    "kept, no questions) or structure."
)


def render(table_text: str) -> dict[str, str]:
    """File name -> contents of the four tables."""
    vocab = vocabulary()
    srows = scannet_rows(table_text)
    return {
        "vsibench_categories.tsv": _tsv(
            [
                GENERATED,
                "The categories VSI-Bench questions name; every mapped label in the other tables is one of them.",
                "evidence: arkitscenes / scannetpp / scannet-v2 = the benchmark authors' per-dataset category lists",
                f"  ({VSI_UTILS_URL}); scannet-rows = seen in VSI-Bench ScanNet rows; paper-fig1 = VSI-Bench paper, "
                "Fig. 1.",
            ],
            ["category", "evidence"],
            [{"category": c, "evidence": e} for c, e in vocab.items()],
        ),
        "scannet_labels.tsv": _tsv(
            [
                GENERATED,
                f"Source: scannetv2-labels.combined.tsv, sha256 {SCANNET_TABLE_SHA256}",
                f"  {SCANNET_TABLE_URL}",
                "raw_category, category, nyu40class and count are ScanNet's columns, unchanged.",
                COLUMNS,
            ],
            ["raw_category", "category", "nyu40class", "count", "status", "vsibench_category", "rule"],
            srows,
        ),
        "arkitscenes_labels.tsv": _tsv(
            [
                GENERATED,
                f"Source: ARKitScenes 3DOD class_names, {ARKIT_TAXONOMY_URL}",
                f"  and VSI-Bench's ARKitScenes filter/mapper (arkitscenes_utils.py, {VSI_UTILS_URL}).",
                COLUMNS,
            ],
            ["raw_label", "status", "vsibench_category", "rule"],
            arkit_rows(),
        ),
        "scannetpp_labels.tsv": _tsv(
            [
                GENERATED,
                "Source: VSI-Bench's ScanNet++ class list, filter and mapper (SCANNETPP_INST_SEG_CATEGORY, "
                "INVALID_CATES,",
                f"  CATE_MAPPER in scannetpp_utils.py, {VSI_UTILS_URL}).",
                "Raw labels are segments_anno.json segGroups labels; a label not listed here is excluded by the "
                "loader.",
                COLUMNS,
            ],
            ["raw_label", "status", "vsibench_category", "rule"],
            scannetpp_rows(),
        ),
    }


def default_table() -> Optional[Path]:
    spec = importlib.util.find_spec("open3d")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "_ml3d" / "datasets" / "_resources" / "scannet" / "scannetv2-labels.combined.tsv"
        if p.is_file():
            return p
    return None


def summary(table_text: str) -> str:
    rows = scannet_rows(table_text)
    by = Counter(r["status"] for r in rows)
    counts = Counter()
    for r in rows:
        counts[r["status"]] += int(r["count"])
    objects = counts["mapped"] + counts["excluded"]
    return (
        f"ScanNet raw labels: {by['mapped']} mapped, {by['excluded']} excluded, {by['structure']} structure (of "
        f"{len(rows)}); "
        f"instances: mapped {counts['mapped']} = {100 * counts['mapped'] / sum(counts.values()):.1f}% of all "
        f"{sum(counts.values())}, {100 * counts['mapped'] / objects:.1f}% of the {objects} non-structure; "
        f"{len(set(r['vsibench_category'] for r in rows if r['vsibench_category']))} categories used; "
        f"vocabulary {len(vocabulary())} categories"
    )


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--table", type=Path, help="path to scannetv2-labels.combined.tsv (default: the copy in the open3d wheel)"
    )
    p.add_argument("--out", type=Path, default=DATA_DIR, help="output folder (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if the files in --out differ")
    p.add_argument(
        "--allow-other-table", action="store_true", help="accept a table whose SHA-256 differs from the pinned one"
    )
    args = p.parse_args(argv)
    table = args.table or default_table()
    if table is None or not table.is_file():
        p.error("no ScanNet label table: pass --table PATH (see the docstring for public copies)")
    data = table.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SCANNET_TABLE_SHA256 and not args.allow_other_table:
        p.error(
            f"{table} has sha256 {digest}, expected {SCANNET_TABLE_SHA256}; pass --allow-other-table to use it anyway"
        )
    text = data.decode("utf-8")
    files = render(text)
    stale = [
        name
        for name, content in files.items()
        if not (args.out / name).is_file() or (args.out / name).read_text(encoding="utf-8") != content
    ]
    if args.check:
        for name in stale:
            print(f"stale: {args.out / name}", file=sys.stderr)
        print(summary(text))
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (args.out / name).write_text(content, encoding="utf-8")
    print(f"wrote {', '.join(sorted(files))} to {args.out}")
    print(summary(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
