"""The `analyze` stage's app-side pieces (`engine/stages/analyze/`): its result names the
release's architecture and family; its panel, drawn before any job holds the stage, is the
architecture analysis."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="analyze",
    store_result="adaptation.services.stage_results:store_architecture",
    panel_template="adaptation/panels/analyze.html",
    presenter="adaptation.presenters.stage_panels:analyze_panel",
    always_drawn=True,
)
