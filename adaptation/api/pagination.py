"""Page-numbered lists: `?page=N&page_size=M` (`API_PAGE_SIZE` by default, from 1 to
`API_MAX_PAGE_SIZE`), answered as {"count", "next", "previous", "results"}."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

API_PAGE_SIZE = 50
API_MAX_PAGE_SIZE = 500


class Pagination(PageNumberPagination):
    """Pages of `page_size` rows (`?page_size=`, a whole number from 1 to
    `API_MAX_PAGE_SIZE`); a page past the last is a 404.

    DRF falls back to the default size for a `page_size` it cannot read (`null`, blank,
    `-3`) and cuts one over the maximum silently; here each is a 400 naming the range, as
    the schema's bounds say."""

    page_size = API_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = API_MAX_PAGE_SIZE

    def get_page_size(self, request: Request) -> int:
        """The requested page size, or `API_PAGE_SIZE` when none is asked. Raises
        `ValidationError` (a 400 on `page_size`) unless it is a whole number in range."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        try:
            size = int(raw.strip())
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise ValidationError(
                {
                    self.page_size_query_param: [
                        f"A whole number from 1 to {self.max_page_size}, not {raw!r}."
                    ]
                }
            )
        return size

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """DRF's `page` and `page_size` parameters, with their bounds."""
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1}
            elif parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": self.max_page_size,
                }
        return parameters
