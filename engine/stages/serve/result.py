"""The serve stage's result, typed: what `run.run` returns (docs/stages/serve.md, "The
result") read back, and every judgement made of it.

`ServeResult.from_stored(mapping)` reads a stored row whatever version of the stage wrote it:
a missing key reads as None or empty, a value of the wrong type is ignored (`engine.stored`),
and it never raises. The stage's findings, its release-notes section, the verdict the run
concludes with, the release page's panel and charts, the stored `PerformancePoint` rows and
the regression figures all ask it, never the raw dict; the judgements (the precision check's
rule and its per-figure limits, the checks a run failed, the knee's rule, the measured-on
label) are its methods, written once here.

Where the run writes a part through its type (`to_dict`: the precision check, the knee, a
failure, the TP check), the keys it writes are the keys `from_stored` reads.

Times are seconds, throughput tokens/s, memory bytes, log-probabilities natural logs.
Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.formatting import finite
from engine.stored import (
    StageFailure,
    as_count,
    as_list,
    as_mapping,
    flag,
    text,
    texts,
    whole_number,
    within,
)

from .command import CommandChange, command_changes
from .full_size_result import (
    FullSizeRun,
    Level,
    MetricsSample,
    full_size_run,
    levels_of,
    metrics_samples,
)

# The result's own statuses: launched and measured, measured on an endpoint a team runs, a
# pool without an engine (nothing else is set), or failed.
STATUSES = ("served", "attached", "not_configured", "failed")
# The statuses of a run that judged the release (a pool without an engine judges nothing).
JUDGING_STATUSES = ("served", "attached", "failed")
# The phases a run fails in before the engine answered: nothing after them was measured.
LAUNCH_PHASES = ("checkpoint", "launch")
# The checks a measured run is judged by, in the order a failure names them.
CHECKS = ("precision", "tp", "sweep")

# The knee's rule codes (`verdict.knee`, by the performance stage's `find_knee`): "found"
# (from that level output tokens/s grew less than `growth_threshold` per doubling to every
# larger level), "beyond_sweep" (it kept growing to the largest level, which is given) or
# "one_level" (only one level to read). Results stored before the codes were renamed say
# "growth_below_threshold" or "largest_measured".
KNEE_RULES = ("found", "beyond_sweep", "one_level")
_EARLIER_KNEE_CODES = {"growth_below_threshold": "found", "largest_measured": "beyond_sweep"}


@dataclass(frozen=True)
class Failure(StageFailure):
    """Why the stage failed (`engine.stored.StageFailure`, read as every stage's failure is):
    the `phase` it failed in ("checkpoint", "launch", "precision", "tp", "sweep", "metrics";
    "" when not said), its `reason`, the engine's own error lines, and who is at fault
    (`culprit`: "release", "infrastructure"; "" when not said)."""

    @property
    def before_serving(self) -> bool:
        """Whether the run failed before the engine answered (saving the checkpoint or
        launching): it measured nothing of precision, TP or load."""
        return self.phase in LAUNCH_PHASES


@dataclass(frozen=True)
class EngineLaunch:
    """The engine that served: its name and version, whether day0 launched it ("launched")
    or attached to a running endpoint ("attached"; the result's `mode`), the plan's command,
    the command launched, the flags that differ and the engine's image ("" where none)."""

    name: str
    version: str
    mode: str
    planned_command: str
    launched_command: str
    changes: list[CommandChange]
    image: str = ""

    @classmethod
    def from_stored(cls, value: Any, *, mode: Any = None) -> EngineLaunch | None:
        engine = as_mapping(value)
        if not engine:
            return None
        return cls(
            name=text(engine.get("name")),
            version=text(engine.get("version")),
            mode=text(mode),
            planned_command=text(engine.get("command")),
            launched_command=text(engine.get("launched_command")),
            changes=command_changes(engine.get("command_diff")),
            image=text(engine.get("image")),
        )


@dataclass(frozen=True)
class ServedCheckpoint:
    """What the engine loaded: `kind` "twin" (the scaled twin saved as a checkpoint) or
    "real" (the release's real weights), its parameters, bytes, dtype and tokenizer kind, and
    the architecture where the result names one ("" otherwise)."""

    kind: str
    parameters: float | None
    bytes: float | None
    dtype: str
    tokenizer: str
    architecture: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> ServedCheckpoint | None:
        checkpoint = as_mapping(value)
        if not checkpoint:
            return None
        return cls(
            kind="real" if checkpoint.get("kind") == "real" else "twin",
            parameters=finite(checkpoint.get("parameters")),
            bytes=finite(checkpoint.get("bytes")),
            dtype=text(checkpoint.get("dtype")),
            tokenizer=text(checkpoint.get("tokenizer")),
            architecture=text(checkpoint.get("architecture") or checkpoint.get("model_type")),
        )

    @property
    def real(self) -> bool:
        return self.kind == "real"


@dataclass(frozen=True)
class TokenDivergence:
    """Where two runs' tokens first differ: the prompt (its index) and the position in the
    generated tokens; for the precision check also the engine's token and the reference's
    argmax there (ids), the reference's margin between them (its logprob of its argmax less
    that of the engine's token) and whether that is a near-tie (within the logprob limit);
    None where not said."""

    prompt: int | None
    position: int | None
    engine_token: int | None = None
    reference_token: int | None = None
    margin: float | None = None
    tie: bool | None = None

    @classmethod
    def from_stored(cls, value: Any) -> TokenDivergence | None:
        divergence = as_mapping(value)
        if not divergence:
            return None
        return cls(
            prompt=whole_number(divergence.get("prompt")),
            position=whole_number(divergence.get("position")),
            engine_token=whole_number(divergence.get("engine_token")),
            reference_token=whole_number(divergence.get("reference_token")),
            margin=finite(divergence.get("margin")),
            tie=flag(divergence.get("tie")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "position": self.position,
            "engine_token": self.engine_token,
            "reference_token": self.reference_token,
            "margin": self.margin,
            "tie": self.tie,
        }


@dataclass(frozen=True)
class PromptAgreement:
    """One prompt of the precision check: its index, tokens generated, the fraction agreeing
    with the reference, its first divergence, the tokens until its first divergence beyond a
    tie (all of them without one) and that divergence."""

    prompt: int | None
    tokens: int | None
    agreement: float | None
    first_divergence: TokenDivergence | None
    tokens_until_divergence: int | None
    first_non_tie_divergence: TokenDivergence | None

    @classmethod
    def from_stored(cls, value: Any) -> PromptAgreement:
        row = as_mapping(value)
        return cls(
            prompt=whole_number(row.get("prompt")),
            tokens=whole_number(row.get("tokens")),
            agreement=finite(row.get("agreement")),
            first_divergence=TokenDivergence.from_stored(row.get("first_divergence")),
            tokens_until_divergence=whole_number(row.get("tokens_until_divergence")),
            first_non_tie_divergence=TokenDivergence.from_stored(
                row.get("first_non_tie_divergence")
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "tokens": self.tokens,
            "agreement": self.agreement,
            "first_divergence": _dict_or_none(self.first_divergence),
            "tokens_until_divergence": self.tokens_until_divergence,
            "first_non_tie_divergence": _dict_or_none(self.first_non_tie_divergence),
        }


def _dict_or_none(value: TokenDivergence | None) -> dict[str, Any] | None:
    return None if value is None else value.to_dict()


@dataclass(frozen=True)
class PrecisionCheck:
    """The engine's greedy tokens and log-probabilities against transformers in float32 on
    the same checkpoint (`precision.py` measures the figures; the module docstring there says
    what each is): the dtype served, prompts and tokens compared, token agreement (a
    fraction), the tokens until the first divergence beyond a tie, the first divergence (None:
    none), the largest |Δ logprob| and the KL over the top-k, near-tie disagreements, engine
    positions whose logprobs were not finite, each figure's limit and where the limits come
    from, the verdict (`passed`; None: not judged, `reason` then says why:
    "no_limits_for_dtype", "no_reference") and the per-prompt figures.

    `within_limits` is the rule the verdict is made by; a stored row's `passed` is the
    verdict its run made."""

    dtype: str
    passed: bool | None
    reason: str = ""
    prompts: int | None = None
    tokens_compared: int | None = None
    token_agreement: float | None = None
    tokens_until_divergence: int | None = None
    first_divergence: TokenDivergence | None = None
    max_abs_logprob_diff: float | None = None
    kl_top_k: float | None = None
    ties: int | None = None
    non_finite: int | None = None
    limit_max_abs_logprob_diff: float | None = None
    limit_kl_top_k: float | None = None
    limits_source: str = ""
    per_prompt: list[PromptAgreement] = field(default_factory=list)

    @classmethod
    def from_stored(cls, value: Any) -> PrecisionCheck | None:
        precision = as_mapping(value)
        if not precision:
            return None
        limits = as_mapping(precision.get("limits"))
        return cls(
            dtype=text(precision.get("dtype")),
            passed=flag(precision.get("passed")),
            reason=text(precision.get("reason")),
            prompts=whole_number(precision.get("prompts")),
            tokens_compared=whole_number(precision.get("tokens_compared")),
            token_agreement=finite(precision.get("token_agreement")),
            tokens_until_divergence=whole_number(precision.get("tokens_until_divergence")),
            first_divergence=TokenDivergence.from_stored(precision.get("first_divergence")),
            max_abs_logprob_diff=finite(precision.get("max_abs_logprob_diff")),
            kl_top_k=finite(precision.get("kl_top_k")),
            ties=whole_number(precision.get("ties")),
            non_finite=whole_number(precision.get("non_finite")),
            limit_max_abs_logprob_diff=finite(limits.get("max_abs_logprob_diff")),
            limit_kl_top_k=finite(limits.get("kl_top_k")),
            limits_source=text(limits.get("source")),
            per_prompt=[
                PromptAgreement.from_stored(p) for p in as_list(precision.get("per_prompt"))
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        """The check as the stage stores it: a check that was not measured holds its dtype,
        `passed` None and the reason only."""
        if not self.measured:
            return {"dtype": self.dtype, "passed": self.passed, "reason": self.reason}
        return {
            "dtype": self.dtype,
            "prompts": self.prompts,
            "tokens_compared": self.tokens_compared,
            "token_agreement": self.token_agreement,
            "tokens_until_divergence": self.tokens_until_divergence,
            "first_divergence": _dict_or_none(self.first_divergence),
            "max_abs_logprob_diff": self.max_abs_logprob_diff,
            "kl_top_k": self.kl_top_k,
            "ties": self.ties,
            "non_finite": self.non_finite,
            "limits": {
                "max_abs_logprob_diff": self.limit_max_abs_logprob_diff,
                "kl_top_k": self.limit_kl_top_k,
                "source": self.limits_source,
            },
            "passed": self.passed,
            "per_prompt": [p.to_dict() for p in self.per_prompt],
        }

    @property
    def measured(self) -> bool:
        """Whether tokens were compared (a check without limits or a reference was not)."""
        return self.tokens_compared is not None

    @property
    def logprob_within(self) -> bool | None:
        """Whether the largest |Δ logprob| is within its limit (None: either is missing)."""
        return within(self.max_abs_logprob_diff, self.limit_max_abs_logprob_diff)

    @property
    def kl_within(self) -> bool | None:
        """Whether the KL over the top-k is within its limit (None: either is missing)."""
        return within(self.kl_top_k, self.limit_kl_top_k)

    @property
    def disagreements_beyond_tie(self) -> int | None:
        """Positions where the engine's token is not the reference's argmax and the
        reference's margin is above the logprob limit (None: the figures are missing)."""
        if self.tokens_compared is None or self.token_agreement is None or self.ties is None:
            return None
        agreed = round(self.token_agreement * self.tokens_compared)
        return max(self.tokens_compared - agreed - self.ties, 0)

    @property
    def within_limits(self) -> bool:
        """The precision rule: tokens were compared, every engine logprob was finite, every
        disagreement was a near-tie, and the largest |Δ logprob| and the KL over the top-k are
        within their limits."""
        return (
            bool(self.tokens_compared)
            and self.non_finite == 0
            and self.disagreements_beyond_tie == 0
            and self.logprob_within is True
            and self.kl_within is True
        )

    def judged(self) -> PrecisionCheck:
        """This check with its verdict made by `within_limits` (the stage calls it once the
        figures are measured)."""
        return replace(self, passed=self.within_limits)


@dataclass(frozen=True)
class TPCheck:
    """The plan's tensor-parallel degree against TP=1 through the engine: TP planned and
    launched, the degree compared with, whether greedy decoding matched token for token
    (None: not compared), tokens compared, the first divergence, why the degree launched
    differs or the check was not made (`reason`, a code; "" when it was) and the TP=1
    launch's error where it failed."""

    planned: int | None
    launched: int | None
    compared_with: int | None = None
    greedy_match: bool | None = None
    tokens_compared: int | None = None
    first_divergence: TokenDivergence | None = None
    reason: str = ""
    error: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> TPCheck | None:
        tp = as_mapping(value)
        if not tp:
            return None
        return cls(
            planned=whole_number(tp.get("planned")),
            launched=whole_number(tp.get("launched")),
            compared_with=whole_number(tp.get("compared_with")),
            greedy_match=flag(tp.get("greedy_match")),
            tokens_compared=whole_number(tp.get("tokens_compared")),
            first_divergence=TokenDivergence.from_stored(tp.get("first_divergence")),
            reason=text(tp.get("reason")),
            error=text(tp.get("error")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The check as the stage stores it (`error` only where the TP=1 launch failed)."""
        tp = {
            "planned": self.planned,
            "launched": self.launched,
            "compared_with": self.compared_with,
            "greedy_match": self.greedy_match,
            "tokens_compared": self.tokens_compared,
            "first_divergence": _dict_or_none(self.first_divergence),
            "reason": self.reason,
        }
        return tp | ({"error": self.error} if self.error else {})

    @property
    def compared(self) -> bool:
        return self.greedy_match is not None


@dataclass(frozen=True)
class Knee:
    """The sweep's knee: the concurrency past which more requests in flight stop paying,
    output tokens/s and TPOT p50 (s) there, whether the rule found one (`found`), the rule
    that chose it (`rule`, one of `KNEE_RULES`; "" when the result names none known), the
    growth per doubling the rule used and the growth from the knee to twice it (fractions;
    None when not stored)."""

    concurrency: int
    output_tokens_per_s: float | None
    tpot_s_p50: float | None
    rule: str
    found: bool | None = None
    growth_threshold: float | None = None
    growth_at_knee: float | None = None

    @classmethod
    def from_stored(cls, value: Any) -> Knee | None:
        """The knee a result holds; None without one or without its concurrency."""
        knee = as_mapping(value)
        concurrency = whole_number(knee.get("concurrency"))
        if concurrency is None:
            return None
        found = flag(knee.get("found"))
        rule = text(knee.get("reason"))
        rule = _EARLIER_KNEE_CODES.get(rule, rule)
        if rule not in KNEE_RULES:
            rule = ("found" if found else "beyond_sweep") if found is not None else ""
        return cls(
            concurrency=concurrency,
            output_tokens_per_s=finite(knee.get("output_tokens_per_s")),
            tpot_s_p50=finite(knee.get("tpot_s_p50")),
            rule=rule,
            found=found,
            growth_threshold=finite(knee.get("growth_threshold")),
            growth_at_knee=finite(knee.get("growth_at_knee")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "output_tokens_per_s": self.output_tokens_per_s,
            "tpot_s_p50": self.tpot_s_p50,
            "found": self.found,
            "growth_at_knee": self.growth_at_knee,
            "growth_threshold": self.growth_threshold,
            "reason": self.rule,
        }


@dataclass(frozen=True)
class SweepSettings:
    """What each level of the twin's load sweep sent: the concurrency levels, prompt and
    output tokens per request, the largest concurrency, requests per level (None: the
    generator's default), the load generator and how long the sweep took (s)."""

    levels: list[int]
    input_tokens: int | None
    output_tokens: int | None
    max_concurrency: int | None
    requests_per_level: int | None
    load_generator: str
    duration_s: float | None

    @classmethod
    def from_stored(cls, value: Any) -> SweepSettings | None:
        settings = as_mapping(value)
        if not settings:
            return None
        levels = (whole_number(v) for v in as_list(settings.get("levels")))
        return cls(
            levels=[level for level in levels if level is not None],
            input_tokens=whole_number(settings.get("input_tokens")),
            output_tokens=whole_number(settings.get("output_tokens")),
            max_concurrency=whole_number(settings.get("max_concurrency")),
            requests_per_level=whole_number(settings.get("requests_per_level")),
            load_generator=text(settings.get("load_generator")),
            duration_s=finite(settings.get("duration_s")),
        )


@dataclass(frozen=True)
class EngineMetrics:
    """The engine's Prometheus metrics scraped during the twin's sweep (`metrics.Scraper`):
    the interval between scrapes (s), the samples, how many scrapes failed and the last
    failure."""

    interval_s: float | None
    samples: list[MetricsSample]
    errors: int | None = None
    last_error: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> EngineMetrics | None:
        metrics = as_mapping(value)
        if not metrics:
            return None
        return cls(
            interval_s=finite(metrics.get("interval_s")),
            samples=metrics_samples(metrics.get("series")),
            errors=whole_number(metrics.get("errors")),
            last_error=text(metrics.get("last_error")),
        )

    def peak(self, key: str) -> float | None:
        """The largest value of figure `key` ("kv_cache_usage", "running", ...) over the
        samples; None when no sample has it."""
        values = [v for v in (finite(getattr(s, key)) for s in self.samples) if v is not None]
        return max(values) if values else None

    def last(self, key: str) -> float | None:
        """The last value of figure `key` (a counter's value at the end of the sweep)."""
        for sample in reversed(self.samples):
            value = finite(getattr(sample, key))
            if value is not None:
                return value
        return None

    @property
    def prefix_cache_hit_ratio(self) -> float | None:
        """Prefix-cache hit tokens over looked-up tokens at the end of the sweep (None
        without a lookup)."""
        hits, queries = self.last("prefix_cache_hits"), self.last("prefix_cache_queries")
        return hits / queries if hits is not None and queries else None


@dataclass(frozen=True)
class ServeResult:
    """A serve run's result (docs/stages/serve.md, "The result"): `status` (one of
    `STATUSES`, "" for anything else), the engine and checkpoint, load time (s), peak memory
    (bytes), the engine's startup lines, the precision check, the twin's sweep (its knee
    level marked) with its settings and knee, the engine's metrics, the TP check, the
    full-size run (`full_size_result.FullSizeRun`), the run's verdict (`passed`) and why it
    failed. Read it with `from_stored`; ask it the judgements below."""

    status: str
    mode: str = ""
    engine: EngineLaunch | None = None
    checkpoint: ServedCheckpoint | None = None
    load_s: float | None = None
    peak_memory_bytes: int | float | None = None
    startup_log: list[str] = field(default_factory=list)
    precision: PrecisionCheck | None = None
    sweep: list[Level] = field(default_factory=list)
    sweep_settings: SweepSettings | None = None
    knee: Knee | None = None
    metrics: EngineMetrics | None = None
    tp: TPCheck | None = None
    full_size: FullSizeRun | None = None
    passed: bool | None = None
    failure: Failure | None = None

    @classmethod
    def from_stored(cls, value: Mapping[str, Any] | Any) -> ServeResult:
        """The result of a stored row (or the run's dict being built); never raises."""
        result = as_mapping(value)
        status = text(result.get("status"))
        knee = Knee.from_stored(result.get("knee"))
        sweep = levels_of(result.get("sweep"))
        if knee is not None:
            sweep = [replace(level, knee=level.concurrency == knee.concurrency) for level in sweep]
        return cls(
            status=status if status in STATUSES else "",
            mode=text(result.get("mode")),
            engine=EngineLaunch.from_stored(result.get("engine"), mode=result.get("mode")),
            checkpoint=ServedCheckpoint.from_stored(result.get("checkpoint")),
            load_s=finite(result.get("load_s")),
            peak_memory_bytes=as_count(result.get("peak_memory_bytes")),
            startup_log=texts(result.get("startup_log")),
            precision=PrecisionCheck.from_stored(result.get("precision")),
            sweep=sweep,
            sweep_settings=SweepSettings.from_stored(result.get("sweep_settings")),
            knee=knee,
            metrics=EngineMetrics.from_stored(result.get("metrics")),
            tp=TPCheck.from_stored(result.get("tp")),
            full_size=full_size_run(result),
            passed=flag(result.get("passed")),
            failure=Failure.from_stored(result.get("failure")),
        )

    # --- what the run was ---------------------------------------------------------------

    @property
    def judging(self) -> bool:
        """Whether the run judged the release (served, attached or failed; a pool without an
        engine, or a row that is no serve result, judged nothing)."""
        return self.status in JUDGING_STATUSES

    @property
    def failed_before_serving(self) -> bool:
        """Whether it failed saving the checkpoint or launching the engine."""
        return self.failure is not None and self.failure.before_serving

    @property
    def engine_label(self) -> str:
        """The engine as a note names it: "vllm 0.32.0", "the engine" where none is named."""
        if self.engine is None:
            return "the engine"
        return f"{self.engine.name or 'the engine'} {self.engine.version}".strip()

    @property
    def checkpoint_kind(self) -> str:
        """ "real" for the release's real weights, else "twin" (what every figure outside
        the full-size run was measured on)."""
        return self.checkpoint.kind if self.checkpoint is not None else "twin"

    @property
    def measured_on(self) -> str:
        """ "release" (the real weights) or "twin", as stored rows and regressions name it."""
        return "release" if self.checkpoint_kind == "real" else "twin"

    @property
    def dtype(self) -> str:
        """The dtype served: the precision check's, else the checkpoint's ("" when neither)."""
        precision = self.precision.dtype if self.precision is not None else ""
        return precision or (self.checkpoint.dtype if self.checkpoint is not None else "")

    # --- the judgements -------------------------------------------------------------------

    @property
    def precision_passed(self) -> bool | None:
        """The precision check's verdict (None: not measured or not judged)."""
        return self.precision.passed if self.precision is not None else None

    @property
    def tp_matched(self) -> bool | None:
        """Whether the plan's TP gave TP=1's greedy tokens (None: not compared)."""
        return self.tp.greedy_match if self.tp is not None else None

    @property
    def requests_failed(self) -> int:
        """Requests that failed over the twin's sweep."""
        return sum(level.errors or 0 for level in self.sweep)

    @property
    def failed_checks(self) -> list[str]:
        """The checks the run failed, in order (`CHECKS`): precision off its limits, other
        greedy tokens at the plan's TP, a sweep with failed requests or no level."""
        failed = []
        if self.precision_passed is False:
            failed.append("precision")
        if self.tp_matched is False:
            failed.append("tp")
        if not self.sweep or any(level.failed_requests for level in self.sweep):
            failed.append("sweep")
        return failed

    @property
    def sweep_failure_blames_release(self) -> bool:
        """Whether requests failed under load with nobody else to blame: no failure, or one
        whose culprit is the release (an engine that died is the infrastructure's)."""
        return self.requests_failed > 0 and (self.failure is None or self.failure.release_blamed)

    @property
    def sweep_judged(self) -> bool:
        """Whether the sweep says anything of the release: it measured a level and the
        infrastructure did not stop it."""
        infrastructure = self.failure is not None and self.failure.infrastructure_blamed
        return bool(self.sweep) and not infrastructure

    @property
    def knee_level(self) -> Level | None:
        """The twin's sweep level at the knee (None without a knee or that level)."""
        return next((level for level in self.sweep if level.knee), None)
