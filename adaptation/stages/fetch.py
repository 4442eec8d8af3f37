"""The `fetch` stage's app-side pieces (`engine/stages/fetch/`): its result fills the release's
config, files, weights summary, generation config and model card excerpt; it has no panel of
its own."""

from adaptation.stages import AppStage

STAGE = AppStage(
    name="fetch",
    store_result="adaptation.services.stage_results:store_fetched_files",
)
