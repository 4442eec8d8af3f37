"""Each stage's app-side pieces, in one module per stage: `adaptation/stages/<name>.py` holds
`STAGE`, the stage's `AppStage` (see docs/extending.md, "Adding a stage").

The engine side of a stage is its folder `engine/stages/<name>/` and its `StageDefinition` in
`engine.registry`; this package is the other half: what the app does with the stage's result
(stores rows, reads regression figures), how the release page draws it (panel template and
presenter) and what the board shows of it. The release page, the stored-result service, the
regression reads and the board ask `app_stage(name)` or walk `app_stages()`; none keeps a
table of stages.

Functions are named by import path ("package.module:function", as the engine registry names
`run`, `findings` and `notes`) and resolved when called: the stage modules import nothing of
the presenters, services or selectors that read them, so no import circle forms between
those packages (`lint-imports`). `tests/adaptation/stages/test_app_stages.py` resolves every path
and loads every template named here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from engine.contract import resolve_callable
from engine.registry import stage_names


@dataclass(frozen=True)
class AppStage:
    """One stage's app-side pieces. `name` is its name in `engine.registry`.

    Panel (the release page, `adaptation.presenters.panels`): `panel_template` is the
    template drawing it ("adaptation/panels/<name>.html"; None: no panel of its own); `presenter`
    a function `(ReleasePage) -> values` whose return the template reads as `panel.values`
    (None: the generic `StagePanel`, each job's latest attempt with its result);
    `panel_also_shows` the other stages whose runs the panel draws (the operators panel shows
    precision too), so it is drawn, and reads the jobs, for those as well; `always_drawn`: the
    panel is drawn even when no job holds the stage (the analysis, the plan's "not planned
    yet").

    `store_result` (`adaptation.services.stage_results`): a function `(StageRun, result dict)
    -> None` writing the domain rows the result feeds, run in the transaction that stores it;
    None: the result stays on the run only. `regression_figures`
    (`adaptation.selectors.regressions`): a function `(result mapping) -> list[Figure]`, the
    figures regressions are judged on besides the run's duration; None: the duration only (and
    its results, which can be large, are not read for a baseline).

    Board (`adaptation.selectors.board`, `adaptation.presenters.board`): `cell_figure_keys`, the
    path of keys to a count in the stored result that the stage's board cells show when it is
    not zero (read in the database: the board never loads results), worded by
    `cell_figure_template`; both or neither.

    `charts`: the modules of `adaptation.charts` that draw the stage's results (its presenter,
    or the panel showing it, imports them).
    """

    name: str
    panel_template: str | None = None
    presenter: str | None = None
    panel_also_shows: tuple[str, ...] = ()
    always_drawn: bool = False
    store_result: str | None = None
    regression_figures: str | None = None
    cell_figure_keys: tuple[str, ...] = ()
    cell_figure_template: str | None = None
    charts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Refuse pieces that cannot work together. Raises `ValueError` naming the stage."""
        if self.panel_template is None and (
            self.presenter or self.panel_also_shows or self.always_drawn
        ):
            raise ValueError(f"the {self.name} stage's panel pieces need its panel_template")
        if bool(self.cell_figure_keys) != bool(self.cell_figure_template):
            raise ValueError(
                f"the {self.name} stage's board-cell figure needs both cell_figure_keys and "
                "cell_figure_template"
            )

    @property
    def panel_stages(self) -> tuple[str, ...]:
        """The stages whose runs the stage's panel draws: its own, then `panel_also_shows`."""
        return (self.name, *self.panel_also_shows)

    def resolved(self, piece: str) -> Any:
        """The function the field `piece` ("presenter", "store_result", "regression_figures")
        names, or None when the stage has none. Raises `ImportError`/`AttributeError` for a
        path naming no function (the guard test calls it for every path)."""
        path = getattr(self, piece)
        return None if path is None else resolve_callable(path)


def _module_name(stage: str) -> str:
    return f"{__name__}.{stage}"


def app_stage(name: str) -> AppStage | None:
    """The app-side pieces of the registered stage `name`; None for a name the engine registry
    does not know (a stage run stored by an older version). Raises `ImportError` for a
    registered stage without its module `adaptation/stages/<name>.py`, and `LookupError` for a
    module whose `STAGE` is another stage's."""
    if name not in stage_names():
        return None
    stage = importlib.import_module(_module_name(name)).STAGE
    if stage.name != name:
        raise LookupError(f"adaptation/stages/{name}.py registers stage {stage.name!r}")
    return stage


def app_stages() -> list[AppStage]:
    """Every registered stage's app-side pieces, in registry order (the order a job runs them
    and the release page draws them). Raises as `app_stage` does."""
    return [stage for name in stage_names() if (stage := app_stage(name)) is not None]
