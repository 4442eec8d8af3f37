"""The `distributed` stage's app-side pieces (`engine/stages/distributed/`): its panel shows
each pool's split run."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="distributed",
    panel_template="adaptation/panels/distributed.html",
    presenter="adaptation.presenters.stage_panels:distributed_panel",
)
