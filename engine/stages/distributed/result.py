"""The distributed stage's result, typed: what `run.run` returns (`validate_split`'s result
with the plan's split, the degree's reason, the worker's devices, the divisibility and the
twin; or `run.not_validated(...)`), or what a failed run keeps, read back, and every
judgement made of it.

`DistributedResult.from_stored(mapping)` reads a stored row whatever version of the stage
wrote it: a missing key reads as None or empty, a value of the wrong type is ignored
(`engine.stored`), and it never raises. The stage's release-notes section, the release
page's panel and the measured point on the plan's scaling chart ask it, never the raw dict;
the judgements (the verdict, whether the split matched the reference, the rank a failure is
about, a crash against a mismatch, the run broken on purpose, why expert parallelism was left
out, the scaling point measured) are its methods, written once here.

Every figure is measured on the scaled twin: errors in logit units, times in seconds,
throughput tokens/s, shares and efficiencies fractions. Plain Python: neither Django nor
torch.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.formatting import finite
from engine.stages.plan.result import Split
from engine.stored import as_list, as_mapping, flag, string, text, whole_number

from .degree import EP_NOT_VALIDATED

# The verdicts of a run (`DistributedResult.verdict`): it ran the split and every rank matched
# the reference, it ran it and a rank did not (or crashed), or it could not run it here.
PASSED = "passed"
FAILED = "failed"
NOT_VALIDATED = "not-validated"

# The decode figures measured across the ranks (`DistributedResult.headline`).
HEADLINE_FIGURES = (
    "step_time_s",
    "step_time_tp1_s",
    "tokens_per_s",
    "tokens_per_s_tp1",
    "comm_fraction",
    "scaling_efficiency",
)


def _texts(value: Any) -> list[str]:
    return [str(item) for item in as_list(value)]


@dataclass(frozen=True)
class Divergence:
    """The first module of a rank whose output left its tolerance (`compare.first_divergence`):
    its path, layer and kind (attention, mlp, ...), and its error against its tolerance, or
    the shapes that did not match the reference's ([reference, rank]; None otherwise)."""

    module: str
    layer: int | None
    kind: str
    max_abs_error: float | None
    tolerance: float | None
    shape: list[Any] | None = None

    @classmethod
    def from_stored(cls, value: Any) -> Divergence | None:
        """None where the row names no divergent module (every module within tolerance)."""
        div = as_mapping(value)
        if not div:
            return None
        shape = div.get("shape")
        return cls(
            module=text(div.get("module")),
            layer=whole_number(div.get("layer")),
            kind=text(div.get("kind")),
            max_abs_error=finite(div.get("max_abs_error")),
            tolerance=finite(div.get("tolerance")),
            shape=list(shape) if isinstance(shape, list | tuple) and shape else None,
        )

    @property
    def placed(self) -> bool:
        """Whether the stage said where the module is (its layer or kind)."""
        return self.layer is not None or bool(self.kind)

    @property
    def sized(self) -> bool:
        """Whether the stage said by how much it diverged (an error, or a shape)."""
        return self.max_abs_error is not None or bool(self.shape)

    def where(self) -> dict[str, Any]:
        """{"module", "layer", "kind"} ("" or None where not said), as the notes name it."""
        return {"module": self.module, "layer": self.layer, "kind": self.kind}


@dataclass(frozen=True)
class RankComparison:
    """One rank against the float32 reference (`compare.compare_rank`, with its timing): its
    largest logit error and the tolerance, top-1 agreement (a fraction) and disagreements
    outside ties over `positions`, the first divergent module (None when every module stayed
    within its tolerance), decode step time (s, median) and share of time in collectives, and
    the verdict (None where the row holds none); `error` when its outputs could not be
    compared."""

    rank: int | None
    max_abs_error: float | None = None
    tolerance: float | None = None
    top1_agreement: float | None = None
    top1_disagreements_outside_ties: int | None = None
    positions: int | None = None
    divergence: Divergence | None = None
    step_time_s: float | None = None
    comm_fraction: float | None = None
    passed: bool | None = None
    error: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> RankComparison:
        row = as_mapping(value)
        return cls(
            rank=whole_number(row.get("rank")),
            max_abs_error=finite(row.get("max_abs_error")),
            tolerance=finite(row.get("tolerance")),
            top1_agreement=finite(row.get("top1_agreement")),
            top1_disagreements_outside_ties=whole_number(
                row.get("top1_disagreements_outside_ties")
            ),
            positions=whole_number(row.get("positions")),
            divergence=Divergence.from_stored(row.get("first_divergent")),
            step_time_s=finite(row.get("step_time_s")),
            comm_fraction=finite(row.get("comm_fraction")),
            passed=flag(row.get("passed")),
            error=text(row.get("error")),
        )

    @property
    def failed(self) -> bool:
        """Whether the rank's outputs are off the reference (a verdict False)."""
        return self.passed is False


@dataclass(frozen=True)
class DivisibilityRow:
    """Heads or experts over the degree (`degree.divisibility`), in the release and in its
    twin, whether each divides (None: not said) and whether the twin kept the release's
    divisibility."""

    name: str
    release: int | None
    twin: int | None
    degree: int | None
    release_divisible: bool | None
    twin_divisible: bool | None
    kept: bool | None

    @classmethod
    def from_stored(cls, value: Any) -> DivisibilityRow:
        row = as_mapping(value)
        return cls(
            name=text(row.get("name")),
            release=whole_number(row.get("release")),
            twin=whole_number(row.get("twin")),
            degree=whole_number(row.get("degree")),
            release_divisible=flag(row.get("release_divisible")),
            twin_divisible=flag(row.get("twin_divisible")),
            kept=flag(row.get("kept")),
        )


@dataclass(frozen=True)
class RankLog:
    """The end of one rank's log and how its process ended: `exit_code` as `subprocess`
    reports it (negative: killed by that signal; None: not recorded)."""

    rank: int | None
    excerpt: str
    exit_code: int | None = None

    @classmethod
    def from_stored(cls, value: Any) -> RankLog:
        entry = as_mapping(value)
        return cls(
            rank=whole_number(entry.get("rank")),
            excerpt=text(entry.get("excerpt")),
            exit_code=whole_number(entry.get("exit_code")),
        )

    @property
    def signal(self) -> int | None:
        """The signal that killed the process (None: it exited, or it is not recorded)."""
        return -self.exit_code if self.exit_code is not None and self.exit_code < 0 else None

    @property
    def signal_name(self) -> str:
        """The killing signal's name ("SIGKILL"; "" without one, or for a number Python does
        not name)."""
        if self.signal is None:
            return ""
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return ""

    @property
    def ended(self) -> bool:
        """Whether the log says how the process ended."""
        return self.exit_code is not None


@dataclass(frozen=True)
class Tolerance:
    """What every rank was judged by: the logit tolerance (the first rank's, absolute), the
    rule in words and the reference compared against ("" where not said)."""

    max_abs_error: float | None = None
    rule: str = ""
    reference: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> Tolerance:
        tolerance = as_mapping(value)
        return cls(
            max_abs_error=finite(tolerance.get("max_abs_error")),
            rule=text(tolerance.get("rule")),
            reference=text(tolerance.get("reference")),
        )


@dataclass(frozen=True)
class TwinFacts:
    """The twin the ranks ran: its class, parameters and where its weights come from
    ("real" for the release's own)."""

    model_class: str
    parameters: float | None
    weights_source: str

    @classmethod
    def from_stored(cls, value: Any) -> TwinFacts | None:
        twin = as_mapping(value)
        if not twin:
            return None
        return cls(
            model_class=text(twin.get("class")),
            parameters=finite(twin.get("parameters")),
            weights_source=text(twin.get("weights_source")),
        )


@dataclass(frozen=True)
class Headline:
    """Decode across the ranks: the step time (s, the slowest rank's median) and tokens/s at
    TP=`tp` and at TP=1, the share of time in collectives and the scaling efficiency
    (fractions), with the timed steps and the batch they ran."""

    tp: int | None
    step_time_s: float | None
    step_time_tp1_s: float | None
    tokens_per_s: float | None
    tokens_per_s_tp1: float | None
    comm_fraction: float | None
    scaling_efficiency: float | None
    timing_steps: int | None
    batch: int | None


@dataclass(frozen=True)
class MeasuredScaling:
    """The scaling point a `distributed` run measured on the scaled twin, for the plan's
    scaling chart: `devices` (processes), `efficiency` (the twin's TP=1 step time over
    devices x its TP=N step time; 1 = linear), the split validated (`tp`, `ep`), the backend,
    and whether its outputs matched the float32 reference (`passed`)."""

    devices: int
    efficiency: float
    tp: int | None
    ep: int | None
    backend: str
    passed: bool


@dataclass(frozen=True)
class DistributedResult:
    """A distributed run's result (module docstring): whether it ran the split (`validated`;
    None where the row does not say) and the ranks' verdict (`passed`), the stage's reason;
    the split run (TP, EP, processes, backend, device type, threads per rank), the prompt and
    steps, the launcher and wall time, the failure the job injected on purpose; the worst
    rank's logit error and top-1 agreement, the tolerance, every rank, the first divergent
    module, the decode figures at TP=N and TP=1, the collective share and the scaling
    efficiency; its notes and sharding; a crashed rank and every rank's log; and what `run`
    adds: the plan's split, why the degree differs, the worker's devices, the divisibility,
    the twin and why expert parallelism was left out."""

    validated: bool | None = None
    passed: bool | None = None
    reason: str = ""
    backend: str = ""
    device_type: str = ""
    world_size: int | None = None
    tp: int | None = None
    ep: int | None = None
    threads_per_rank: int | None = None
    decode_steps: int | None = None
    timing_steps: int | None = None
    prompt_batch: int | None = None
    prompt_tokens: int | None = None
    prompted: bool = False  # the row says what prompt the ranks ran
    launcher: str = ""
    elapsed_s: float | None = None
    inject: dict[str, Any] = field(default_factory=dict)
    inject_named: str = ""  # the failure injected named in words, where `inject` is no mapping
    max_abs_error: float | None = None
    top1_agreement: float | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)
    ranks: list[RankComparison] = field(default_factory=list)
    first_divergent: Divergence | None = None
    step_time_s: float | None = None
    step_time_tp1_s: float | None = None
    prefill_time_s: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_tp1: float | None = None
    comm_fraction: float | None = None
    scaling_efficiency: float | None = None
    notes: list[str] = field(default_factory=list)
    sharded_blocks: dict[str, bool] = field(default_factory=dict)
    failed_rank: int | None = None
    rank_logs: list[RankLog] = field(default_factory=list)
    plan: Split | None = None
    degree_reason: str = ""
    pool_devices: int | None = None
    divisibility: list[DivisibilityRow] = field(default_factory=list)
    twin: TwinFacts | None = None
    ep_note: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> DistributedResult:
        """The result of a stored row; never raises (anything but a mapping reads as an
        empty result, which judges nothing)."""
        result = as_mapping(value)
        prompt = as_mapping(result.get("prompt"))
        plan = as_mapping(result.get("plan"))
        blocks = as_mapping(as_mapping(result.get("sharding")).get("blocks"))
        return cls(
            validated=flag(result.get("validated")),
            passed=flag(result.get("passed")),
            reason=text(result.get("reason")),
            backend=text(result.get("backend")),
            device_type=text(result.get("device_type")),
            world_size=whole_number(result.get("world_size")),
            tp=whole_number(result.get("tp")),
            ep=whole_number(result.get("ep")),
            threads_per_rank=whole_number(result.get("threads_per_rank")),
            decode_steps=whole_number(result.get("decode_steps")),
            timing_steps=whole_number(result.get("timing_steps")),
            prompt_batch=whole_number(prompt.get("batch")),
            prompt_tokens=whole_number(prompt.get("tokens")),
            prompted=bool(prompt),
            launcher=text(result.get("launcher")),
            elapsed_s=finite(result.get("elapsed_s")),
            inject={str(key): item for key, item in as_mapping(result.get("inject")).items()},
            inject_named=string(result.get("inject")) or "",
            max_abs_error=finite(result.get("max_abs_error")),
            top1_agreement=finite(result.get("top1_agreement")),
            tolerance=Tolerance.from_stored(result.get("tolerance")),
            ranks=[
                RankComparison.from_stored(row)
                for row in as_list(result.get("ranks"))
                if isinstance(row, Mapping)
            ],
            first_divergent=Divergence.from_stored(result.get("first_divergent")),
            **{
                key: finite(result.get(key))
                for key in (
                    "step_time_s",
                    "step_time_tp1_s",
                    "prefill_time_s",
                    "tokens_per_s",
                    "tokens_per_s_tp1",
                    "comm_fraction",
                    "scaling_efficiency",
                )
            },
            notes=_texts(result.get("notes")),
            sharded_blocks={
                str(kind): split for kind, split in blocks.items() if isinstance(split, bool)
            },
            failed_rank=whole_number(result.get("failed_rank")),
            rank_logs=[
                RankLog.from_stored(entry)
                for entry in as_list(result.get("rank_logs"))
                if isinstance(entry, Mapping)
            ],
            plan=Split.from_stored(plan) if plan else None,
            degree_reason=text(result.get("degree_reason")),
            pool_devices=whole_number(result.get("pool_devices")),
            divisibility=[
                DivisibilityRow.from_stored(row)
                for row in as_list(result.get("divisibility"))
                if isinstance(row, Mapping)
            ],
            twin=TwinFacts.from_stored(result.get("twin")),
            ep_note=text(result.get("ep_note")),
        )

    @property
    def ran(self) -> bool:
        """Whether the stage ran the split across processes (`validated` True): a split it
        could not validate here ran nothing."""
        return self.validated is True

    @property
    def verdict(self) -> str | None:
        """`PASSED` (it ran the split and every rank matched the reference), `FAILED` (a rank
        did not, or crashed), `NOT_VALIDATED` (the split could not be validated here, or a run
        whose verdict is missing), or None for a row that is no distributed run."""
        if self.validated is False:
            return NOT_VALIDATED
        if self.validated is not True:
            return None
        if self.passed is None:
            return NOT_VALIDATED
        return PASSED if self.passed else FAILED

    @property
    def matched_reference(self) -> bool:
        """Whether the split ran and every rank's outputs matched the float32 reference."""
        return self.verdict == PASSED

    @property
    def broken_on_purpose(self) -> bool:
        """Whether the job's `inject` option broke the run (it proves the check, not a fault
        of the release): the row's `inject` holds the option's settings, or names the failure
        injected in words."""
        return bool(self.inject) or bool(self.inject_named)

    @property
    def failing_ranks(self) -> list[RankComparison]:
        """The ranks whose outputs are off the reference, in rank order."""
        return [row for row in self.ranks if row.failed]

    @property
    def crashed(self) -> bool:
        """Whether the run failed before any rank's outputs were compared (a rank crashed, or
        the ranks hung): it says nothing of a mismatch."""
        return self.ran and self.passed is False and not self.ranks

    @property
    def failing_rank(self) -> int | None:
        """The rank a failure is about: the one that crashed (`failed_rank`), else the first
        whose outputs are off the reference (None: no rank named)."""
        if self.failed_rank is not None:
            return self.failed_rank
        return next((row.rank for row in self.failing_ranks if row.rank is not None), None)

    def rank_log(self, rank: int | None) -> RankLog | None:
        """The log of `rank` (None without one, or for no rank)."""
        if rank is None:
            return None
        return next((log for log in self.rank_logs if log.rank == rank), None)

    @property
    def failed_rank_exit_code(self) -> int | None:
        """How the crashed rank's process ended (`RankLog.exit_code`; None where unknown)."""
        log = self.rank_log(self.failed_rank)
        return log.exit_code if log is not None else None

    @property
    def real_weights(self) -> bool:
        """Whether the ranks ran the release's real weights (not the seeded twin's)."""
        return self.twin is not None and self.twin.weights_source == "real"

    @property
    def ep_reason(self) -> str:
        """Why expert parallelism was not validated: `ep_note` without its lead
        (`degree.EP_NOT_VALIDATED`), so that a sentence can say it after its own ("" without
        a note)."""
        note = self.ep_note
        if note.lower().startswith(EP_NOT_VALIDATED):
            return note[len(EP_NOT_VALIDATED) :]
        return note

    @property
    def headline(self) -> Headline | None:
        """The decode figures across the ranks; None when the run measured none of them (a
        crashed rank)."""
        figures = {key: getattr(self, key) for key in HEADLINE_FIGURES}
        if all(value is None for value in figures.values()):
            return None
        return Headline(
            tp=self.tp, timing_steps=self.timing_steps, batch=self.prompt_batch, **figures
        )

    def measured_scaling(self, *, succeeded: bool) -> MeasuredScaling | None:
        """The scaling point this run measured, for the plan's scaling chart: None unless it
        ran the split on at least 2 processes and measured an efficiency (a failed
        comparison still times its steps). `succeeded`: whether the run itself succeeded;
        the point passed only then, with every rank matching."""
        devices, efficiency = self.world_size, self.scaling_efficiency
        if not self.ran or efficiency is None or devices is None or devices < 2:
            return None
        return MeasuredScaling(
            devices=devices,
            efficiency=efficiency,
            tp=self.tp,
            ep=self.ep,
            backend=self.backend,
            passed=self.passed is True and succeeded,
        )
