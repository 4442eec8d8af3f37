"""The `stability` stage's app-side pieces (`engine/stages/stability/`): its panel shows each
pool's run with its charts."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="stability",
    panel_template="adaptation/panels/stability.html",
    presenter="adaptation.presenters.stage_panels:stability_panel",
    charts=("adaptation.charts.stability",),
)
