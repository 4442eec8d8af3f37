"""The operators stage's result, typed: what `run.measure_operators` returns (its docstring
names every key) read back, and every judgement made of it.

`OperatorsResult.from_stored(mapping)` reads a stored row whatever version of the stage wrote
it: a missing key reads as None or empty, a value of the wrong type is ignored
(`engine.stored`), and it never raises. The stage's findings and release-notes section, the
release page's operator table, the stored `OperatorCheck` rows and the board's count of
missing operators ask it, never the raw dict: which operators are missing, the count per
status, whether the pool covers every operator, whether a gap is a dtype's only and whether an
operator ran on the host only are judged here once.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.stored import as_list, as_mapping, text, whole_number

# The statuses an operator gets, in the order the stage lists them (missing first).
MISSING = "missing"
FALLBACK = "fallback"
COVERED = "covered"
STATUSES = (MISSING, FALLBACK, COVERED)
# What the operators were checked against when the pool has an operator manifest.
MANIFEST = "manifest"
# The path of keys to the count of missing operators in a stored result: the board reads it
# in the database (it never loads results), so it is named here beside `to_dict`, which
# writes it.
MISSING_COUNT_KEYS = ("counts", MISSING)


def _strings(value: Any) -> tuple[str, ...]:
    """The items of a stored list as text (anything but a list reads as none)."""
    return tuple(str(item) for item in as_list(value))


def _flag(value: Any) -> bool:
    """A stored yes/no: True only for True."""
    return value is True


def dispatcher_name(name: str) -> str:
    """The dispatcher's spelling of a recorded operator: "aten::mm" for the default overload,
    "aten::add.Tensor"."""
    return name.removesuffix(".default")


@dataclass(frozen=True)
class OperatorRow:
    """One operator the twin ran: its name ("aten::mm.default"), the dtypes it ran in, the
    model feature that needed it ("" when none was told), its status (`STATUSES`; "" when
    the row holds none), how that was decided (`via`: "kernel", "composite", "backend
    fallback", "manifest", "kernel lacks bfloat16; ran in float32 on the CPU"...), the
    devices its tensors were on, how many calls and modules, the dtypes the pool lacks for
    it, and whether it ran on the CPU in place of the device."""

    name: str
    status: str
    dtypes: tuple[str, ...] = ()
    feature: str = ""
    via: str = ""
    devices: tuple[str, ...] = ()
    calls: int | None = None
    modules: int | None = None
    missing_dtypes: tuple[str, ...] = ()
    ran_on_cpu: bool = False

    @classmethod
    def from_stored(cls, value: Any) -> OperatorRow:
        row = as_mapping(value)
        return cls(
            name=text(row.get("name")),
            status=text(row.get("status")),
            dtypes=_strings(row.get("dtypes")),
            feature=text(row.get("feature")),
            via=text(row.get("via")),
            devices=_strings(row.get("devices")),
            calls=whole_number(row.get("calls")),
            modules=whole_number(row.get("modules")),
            missing_dtypes=_strings(row.get("missing_dtypes")),
            ran_on_cpu=_flag(row.get("ran_on_cpu")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The row as the stage stores it."""
        return {
            "name": self.name,
            "dtypes": list(self.dtypes),
            "feature": self.feature,
            "status": self.status,
            "via": self.via,
            "devices": list(self.devices),
            "calls": self.calls,
            "modules": self.modules,
            "missing_dtypes": list(self.missing_dtypes),
            "ran_on_cpu": self.ran_on_cpu,
        }

    @property
    def dispatcher_name(self) -> str:
        """The name as the dispatcher spells it ("aten::mm", "aten::add.Tensor"); "?" for a
        row without one."""
        return dispatcher_name(self.name or "?")

    @property
    def missing(self) -> bool:
        return self.status == MISSING

    @property
    def fallback(self) -> bool:
        return self.status == FALLBACK

    @property
    def dtype_gap(self) -> bool:
        """Whether a missing operator lacks some dtypes only, not the operator itself: a kernel
        that lacks the dtype ("kernel lacks ..."), or a manifest listing the operator for
        other dtypes than those lacking."""
        if not self.missing_dtypes:
            return False
        if self.via.startswith("kernel lacks"):
            return True
        return (
            self.via == MANIFEST
            and bool(self.dtypes)
            and not set(self.dtypes) <= set(self.missing_dtypes)
        )


@dataclass(frozen=True)
class OperatorCounts:
    """How many operators the pool covers, misses and serves through its backend's fallback."""

    covered: int = 0
    missing: int = 0
    fallback: int = 0

    @classmethod
    def from_stored(cls, value: Any) -> OperatorCounts | None:
        """The counts of a stored "counts"; None when it holds no mapping."""
        if not isinstance(value, Mapping):
            return None
        return cls(**{status: whole_number(value.get(status)) or 0 for status in STATUSES})

    @classmethod
    def of(cls, rows: list[OperatorRow] | tuple[OperatorRow, ...]) -> OperatorCounts:
        """The count per status of `rows` (a row of another status counts nowhere)."""
        return cls(**{status: sum(1 for r in rows if r.status == status) for status in STATUSES})

    def to_dict(self) -> dict[str, int]:
        """As the stage stores them: covered, missing, fallback."""
        return {COVERED: self.covered, MISSING: self.missing, FALLBACK: self.fallback}


@dataclass(frozen=True)
class ManifestRef:
    """The pool's operator manifest the operators were checked against: the accelerator it
    describes and where it comes from ("" when it names none), and how many operators it
    lists."""

    accelerator: str = ""
    source: str = ""
    operators: int | None = None

    @classmethod
    def from_stored(cls, value: Any) -> ManifestRef | None:
        if not isinstance(value, Mapping):
            return None
        return cls(
            accelerator=text(value.get("accelerator")),
            source=text(value.get("source")),
            operators=whole_number(value.get("operators")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator or None,
            "source": self.source or None,
            "operators": self.operators,
        }


@dataclass(frozen=True)
class OperatorsResult:
    """An operators run's result: each operator the twin ran (`operators`, missing first;
    None when the row holds no operator list, as a run stopped before checking), the names
    missing and those seen on the host only, the stage's notes, the device the twin ran on
    ("cuda:0"), the pool's backend, what the operators were checked against ("manifest" or
    "torch dispatcher (CUDA)"), the dispatch key, the run's dtype, decode steps, the twin that
    ran (its description; None where not said), the count per status as stored (None where
    not stored) and the manifest (None without one)."""

    operators: tuple[OperatorRow, ...] | None = None
    missing: tuple[str, ...] = ()
    host_only: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    device: str = ""
    backend: str = ""
    checked_against: str = ""
    dispatch_key: str = ""
    dtype: str = ""
    decode_steps: int | None = None
    twin: Mapping[str, Any] | None = None
    counts: OperatorCounts | None = None
    manifest: ManifestRef | None = None

    @classmethod
    def from_stored(cls, value: Any) -> OperatorsResult:
        """The result of a stored row; never raises."""
        result = as_mapping(value)
        rows = result.get("operators")
        twin = result.get("twin")
        return cls(
            operators=(
                tuple(OperatorRow.from_stored(r) for r in rows if isinstance(r, Mapping))
                if isinstance(rows, list)
                else None
            ),
            missing=_strings(result.get("missing")),
            host_only=_strings(result.get("host_only")),
            notes=_strings(result.get("notes")),
            device=text(result.get("device")),
            backend=text(result.get("backend")),
            checked_against=text(result.get("checked_against")),
            dispatch_key=text(result.get("dispatch_key")),
            dtype=text(result.get("dtype")),
            decode_steps=whole_number(result.get("decode_steps")),
            twin=dict(twin) if isinstance(twin, Mapping) else None,
            counts=OperatorCounts.from_stored(result.get("counts")),
            manifest=ManifestRef.from_stored(result.get("manifest")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as the stage stores it ("manifest" only where the pool has one)."""
        result: dict[str, Any] = {
            "operators": None if self.operators is None else [r.to_dict() for r in self.operators],
            "missing": list(self.missing),
            "host_only": list(self.host_only),
            "notes": list(self.notes),
            "device": self.device,
            "backend": self.backend,
            "checked_against": self.checked_against,
            "dispatch_key": self.dispatch_key,
            "dtype": self.dtype,
            "decode_steps": self.decode_steps,
            "twin": None if self.twin is None else dict(self.twin),
            "counts": None if self.counts is None else self.counts.to_dict(),
        }
        if self.manifest is not None:
            result["manifest"] = self.manifest.to_dict()
        return result

    @property
    def rows(self) -> tuple[OperatorRow, ...]:
        """Every operator checked (none when the result holds no operator list)."""
        return self.operators or ()

    @property
    def missing_operators(self) -> list[OperatorRow]:
        """The operators the pool's backend lacks (or lacks in a dtype), in the stored order."""
        return [row for row in self.rows if row.missing]

    @property
    def fallback_operators(self) -> list[OperatorRow]:
        """The operators that run through the backend's fallback."""
        return [row for row in self.rows if row.fallback]

    @property
    def status_counts(self) -> OperatorCounts:
        """The count per status: as stored, else counted from the operator list."""
        return self.counts if self.counts is not None else OperatorCounts.of(self.rows)

    @property
    def coverage_passed(self) -> bool | None:
        """Whether the pool covers every operator the twin ran (a fallback covers it); None
        when the result holds neither counts nor an operator list."""
        if self.counts is None and self.operators is None:
            return None
        return self.status_counts.missing == 0

    @property
    def against_manifest(self) -> bool:
        """Whether the operators were checked against the pool's operator manifest (else
        against torch's dispatcher)."""
        return self.checked_against == MANIFEST or self.manifest is not None

    def host_only_on_device(self, row: OperatorRow) -> bool:
        """Whether `row` saw only CPU tensors on a pool whose device is not the CPU: it runs
        on the host, not the device (a lesser gap than one on the device)."""
        return list(row.devices) == ["cpu"] and self.device not in ("", "cpu")
