"""The `precision` stage's app-side pieces (`engine/stages/precision/`): its result is stored as
`PrecisionResult` and `LayerDrift` rows and gives each dtype's relative logit error to the
regressions. It has no panel of its own: the operators panel shows it (`operators.py`), with
its charts."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="precision",
    store_result="adaptation.services.stage_results:store_precision",
    regression_figures="adaptation.selectors.regressions:precision_figures",
    charts=("adaptation.charts.precision",),
)
