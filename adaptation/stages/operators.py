"""The `operators` stage's app-side pieces (`engine/stages/operators/`): its result is stored as
one `OperatorCheck` row per operator; its panel ("Operators and precision") shows the
`precision` stage's runs too; its board cells count the operators missing, at the path the
stage's result names (`engine.stages.operators.result.MISSING_COUNT_KEYS`)."""

from adaptation.stages import AppStage
from engine.stages.operators.result import MISSING_COUNT_KEYS

STAGE = AppStage(
    name="operators",
    store_result="adaptation.services.stage_results:store_operator_checks",
    panel_template="adaptation/panels/operators.html",
    presenter="adaptation.presenters.stage_panels:operators_panel",
    panel_also_shows=("precision",),
    cell_figure_keys=MISSING_COUNT_KEYS,
    cell_figure_template="adaptation/board_cells/operators.html",
)
