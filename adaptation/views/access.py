"""Who may read a page: sign-in (an htmx poll whose session expired sends the whole browser
to the login page) and the permission each page needs (`adaptation.roles`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required as django_login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django_htmx.http import HttpResponseClientRedirect

# What reading each page needs (`adaptation.roles`: managers, engineers and admins hold them).
VIEW_RELEASES = "adaptation.view_modelrelease"
VIEW_JOBS = "adaptation.view_adaptationjob"
VIEW_POOLS = "adaptation.view_acceleratorpool"
VIEW_NOTES = "adaptation.view_releasenotes"


def login_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Django's `login_required`, except that an htmx poll whose session expired sends the
    whole browser to the login page instead of swapping the login form into a table."""
    guarded = django_login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if getattr(request, "htmx", False) and not request.user.is_authenticated:
            login = redirect_to_login(request.get_full_path())
            return HttpResponseClientRedirect(login["Location"])
        return guarded(request, *args, **kwargs)

    return wrapper


# What reading each page needs (`adaptation.roles`: managers, engineers and admins hold them).
VIEW_RELEASES = "adaptation.view_modelrelease"
VIEW_JOBS = "adaptation.view_adaptationjob"
VIEW_POOLS = "adaptation.view_acceleratorpool"


def permission_required(perm: str) -> Callable[..., Callable[..., HttpResponse]]:
    """Sign-in first (`login_required`: anonymous visitors go to the login page), then
    `perm`: a signed-in user without it gets 403, as the API answers them."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def checked(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
            if not request.user.has_perm(perm):
                raise PermissionDenied(f"it needs the {perm} permission")
            return view(request, *args, **kwargs)

        return login_required(checked)

    return decorator
