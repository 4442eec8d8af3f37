"""The `serve` stage's app-side pieces (`engine/stages/serve/`): its load sweeps are stored as
`PerformancePoint` rows marked with the engine; it gives the engine's knee, load time and
precision to the regressions; its panel shows each pool's engine run with its charts (the
performance panel draws its full-size run)."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="serve",
    store_result="adaptation.services.stage_results:store_serve_points",
    regression_figures="adaptation.selectors.regressions:serve_figures",
    panel_template="adaptation/panels/serve.html",
    presenter="adaptation.presenters.stage_panels:serve_panel",
    charts=("adaptation.charts.serve", "adaptation.charts.full_size"),
)
