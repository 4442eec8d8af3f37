"""The `plan` stage's app-side pieces (`engine/stages/plan/`): its panel, drawn before any job
holds the stage (its "not planned yet" links to Compare pools), shows each pool's split with
its charts."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="plan",
    panel_template="adaptation/panels/plan.html",
    presenter="adaptation.presenters.stage_panels:plan_panel",
    always_drawn=True,
    charts=("adaptation.charts.plan",),
)
