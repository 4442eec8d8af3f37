"""The `release_notes` stage's app-side pieces (`engine/stages/release_notes/`): its result is
stored as the next version of the release's notes on the job's pool; its panel lists the
latest notes per pool."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="release_notes",
    store_result="adaptation.services.stage_results:store_release_notes",
    panel_template="adaptation/panels/release_notes.html",
    presenter="adaptation.presenters.stage_panels:release_notes_panel",
)
