"""Page-numbered lists: `?page=N&page_size=M` (`API_PAGE_SIZE` by default, at most
`API_MAX_PAGE_SIZE`), answered as {"count", "next", "previous", "results"}."""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination

API_PAGE_SIZE = 50
API_MAX_PAGE_SIZE = 500


class Pagination(PageNumberPagination):
    """Pages of `page_size` rows (`?page_size=`, at most `API_MAX_PAGE_SIZE`); a page past
    the last is a 404."""

    page_size = API_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = API_MAX_PAGE_SIZE
