"""The `performance` stage's app-side pieces (`engine/stages/performance/`): its points are
stored as `PerformancePoint` rows; it gives its knee's decode tokens/s and TTFT p95 to the
regressions; its panel draws the performance charts."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="performance",
    store_result="adaptation.services.stage_results:store_performance_points",
    regression_figures="adaptation.selectors.regressions:performance_figures",
    panel_template="adaptation/panels/performance.html",
    presenter="adaptation.presenters.stage_panels:performance_panel",
    charts=("adaptation.charts.performance",),
)
