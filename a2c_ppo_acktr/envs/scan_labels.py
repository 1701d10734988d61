"""Raw scan labels -> the categories VSI-Bench's questions name: the tables in ``envs/data/``.

Each raw label is looked up (lower case, ``_`` as a space, single spaces: :func:`clean_label`) in the
dataset's table (``scannet_labels.tsv``, ``arkitscenes_labels.tsv``, ``scannetpp_labels.tsv``,
written by ``scripts/make_label_maps.py`` from ScanNet's ``scannetv2-labels.combined.tsv`` and the
benchmark authors' category lists) and the object's ``label`` is the VSI-Bench category it maps to
(``office chair`` -> ``chair``, ``kitchen cabinets`` -> ``cabinet``, ScanNet ``trash can`` ->
``trash bin``, ARKitScenes ``tv_monitor`` -> ``tv``, ScanNet++ ``ceiling lamp`` -> ``ceiling
light``). Every such category is in ``vsibench_categories.tsv`` (:func:`benchmark_categories`). An
object whose label has no benchmark category (``paper towel dispenser``, a label missing from the
table, the ARKitScenes classes the benchmark leaves out: cabinet, shelf, sink, oven) is excluded by
the loaders (:mod:`~.real_scans`). A label the table does not list but which already is a benchmark
category is kept as is, except for ScanNet++: its annotators type free-form labels (over 1,500 of
them) and the benchmark asks only about its 84 instance classes, so a ScanNet++ label its table does
not list is excluded even when it is a benchmark category elsewhere (:data:`CLOSED_TABLES`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any, Mapping, Optional

STRUCTURE_LABELS = frozenset({"wall", "floor", "ceiling", "remove", "unknown", "object", "otherstructure"})
LABEL_TABLES = {
    "scannet": "scannet_labels.tsv",
    "arkitscenes": "arkitscenes_labels.tsv",
    "scannetpp": "scannetpp_labels.tsv",
}
# Tables whose unlisted labels are excluded: the benchmark picks ScanNet++ objects by its own class list.
CLOSED_TABLES = frozenset({"scannetpp"})
VOCABULARY_TABLE = "vsibench_categories.tsv"
LABEL_STATUSES = ("mapped", "excluded", "structure")


class LabelMapError(ValueError):
    """A label table in ``envs/data/`` is malformed; the message names the file and line."""


@dataclass(frozen=True)
class LabelMap:
    """Raw label -> VSI-Bench category for one dataset (see the module docstring).

    Attributes:
        dataset: ``"scannet"``, ``"arkitscenes"`` or ``"scannetpp"``.
        categories: Normalised raw label -> benchmark category, for labels with status ``mapped``.
        structure: Normalised raw labels of structure (walls, floors, ceilings, "object").
        excluded: Normalised raw labels the table lists without a benchmark category.
        vocabulary: The benchmark's categories (:func:`benchmark_categories`).
        closed: Whether a label the table does not list is excluded even when it is a benchmark
            category (:data:`CLOSED_TABLES`).
    """

    dataset: str
    categories: Mapping[str, str]
    structure: frozenset
    excluded: frozenset
    vocabulary: frozenset = frozenset()
    closed: bool = False

    def lookup(self, raw_label: Any) -> tuple[str, Optional[str]]:
        """``("mapped", category)``, ``("structure", None)`` or ``("excluded", None)``.

        The table decides for the labels it lists; a label it does not list is kept as itself when it
        already is a benchmark category (scans converted from other sources, test fixtures) and the
        table is not ``closed``, and excluded otherwise.
        """
        key = clean_label(raw_label)
        if key in STRUCTURE_LABELS or key in self.structure:
            return "structure", None
        if key in self.categories:
            return "mapped", self.categories[key]
        if not self.closed and key not in self.excluded and key in self.vocabulary:
            return "mapped", key
        return "excluded", None


def read_data_file(name: str) -> str:
    """Text of ``envs/data/<name>`` from the installed package (``importlib.resources``)."""
    try:
        return resources.files(__package__).joinpath("data").joinpath(name).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as e:
        raise LabelMapError(
            f"package data file envs/data/{name} is missing ({e}); reinstall the package or run "
            "scripts/make_label_maps.py"
        ) from e


def _parse_table(text: str, name: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """(columns, [(line number, row)]) of a tab-separated table; ``#`` lines are comments."""
    header: Optional[list[str]] = None
    rows: list[tuple[int, dict[str, str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if header is None:
            header = cells
            continue
        if len(cells) != len(header):
            raise LabelMapError(f"{name} line {number}: {len(cells)} fields, the header has {len(header)}: {line!r}")
        rows.append((number, dict(zip(header, cells))))
    if header is None:
        raise LabelMapError(f"{name} has no header row")
    return header, rows


@functools.lru_cache(maxsize=None)
def benchmark_categories() -> Mapping[str, str]:
    """The categories VSI-Bench questions name -> the evidence for each (``envs/data/vsibench_categories.tsv``;
    read-only, loaded once)."""
    header, rows = _parse_table(read_data_file(VOCABULARY_TABLE), f"envs/data/{VOCABULARY_TABLE}")
    if header[:2] != ["category", "evidence"]:
        raise LabelMapError(f"envs/data/{VOCABULARY_TABLE}: expected columns category, evidence; got {header}")
    out: dict[str, str] = {}
    for number, row in rows:
        name = row["category"]
        if not name or name != clean_label(name) or name in out:
            raise LabelMapError(
                f"envs/data/{VOCABULARY_TABLE} line {number}: category {name!r} is empty, not normalised or repeated"
            )
        out[name] = row["evidence"]
    return MappingProxyType(out)


@functools.lru_cache(maxsize=None)
def label_map(dataset: str) -> LabelMap:
    """The raw-label table of ``dataset`` (``envs/data/<dataset>_labels.tsv``), checked on load: one row per
    normalised raw label, a known status, and every mapped category a :func:`benchmark_categories` name."""
    if dataset not in LABEL_TABLES:
        raise LabelMapError(f"no label table for dataset {dataset!r}; known: {sorted(LABEL_TABLES)}")
    return parse_label_table(
        dataset,
        read_data_file(LABEL_TABLES[dataset]),
        benchmark_categories(),
        f"envs/data/{LABEL_TABLES[dataset]}",
        closed=dataset in CLOSED_TABLES,
    )


def parse_label_table(
    dataset: str, text: str, vocabulary: Mapping[str, str], name: str = "label table", closed: bool = False
) -> LabelMap:
    """A :class:`LabelMap` from a table's text (see :func:`label_map`); errors name ``name`` and the line.

    Args:
        dataset: Dataset the table is for.
        text: Tab-separated: ``#`` comment lines, a header whose first column is the raw label, then
            ``status`` and ``vsibench_category`` columns (others are for the reader).
        vocabulary: The allowed categories (:func:`benchmark_categories`).
        name: How errors refer to the table.
        closed: Exclude the labels the table does not list (:attr:`LabelMap.closed`).

    Raises:
        LabelMapError: A repeated raw label (after normalising), an unknown status, a mapped label whose
            category is not in ``vocabulary``, or an excluded/structure label with a category.
    """
    header, rows = _parse_table(text, name)
    missing = [c for c in ("status", "vsibench_category") if c not in header]
    if missing:
        raise LabelMapError(f"{name}: columns {missing} missing; got {header}")
    key_column = header[0]
    seen: dict[str, int] = {}
    categories: dict[str, str] = {}
    structure: set[str] = set()
    excluded: set[str] = set()
    for number, row in rows:
        key = clean_label(row[key_column])
        status, target = row["status"], row["vsibench_category"]
        where = f"{name} line {number} ({key_column} {row[key_column]!r})"
        if not key:
            raise LabelMapError(f"{where}: empty raw label")
        if key in seen:
            raise LabelMapError(f"{where}: raw label {key!r} already on line {seen[key]}")
        seen[key] = number
        if status not in LABEL_STATUSES:
            raise LabelMapError(f"{where}: status {status!r} is not one of {list(LABEL_STATUSES)}")
        if status == "mapped":
            if target not in vocabulary:
                raise LabelMapError(f"{where}: category {target!r} is not in envs/data/{VOCABULARY_TABLE}")
            categories[key] = target
        elif target:
            raise LabelMapError(f"{where}: a {status} label must have no category, got {target!r}")
        else:
            (structure if status == "structure" else excluded).add(key)
    return LabelMap(dataset, categories, frozenset(structure), frozenset(excluded), frozenset(vocabulary), closed)


def clean_label(label: Any) -> str:
    """Lower case, ``_`` as a space, single spaces: the key of the label tables."""
    return " ".join(str(label).replace("_", " ").lower().split())
