"""The thread dashboard mounted in a Django or Flask app, behind the app's own auth.

Django (``urls.py``)::

    from dormant.contrib.dashboard import django_view
    from dormant.contrib.django import dormant_client
    from proj.celery import app as celery_app

    dashboard = django_view(lambda: dormant_client(celery_app))   # staff only by default
    urlpatterns = [re_path(r"^dormant/ui/(?P<path>.*)$", dashboard), ...]

Flask::

    from dormant.contrib.dashboard import flask_blueprint

    bp = flask_blueprint(dormant.client, allow=lambda: current_user.is_admin)
    app.register_blueprint(bp, url_prefix="/dormant/ui")

The host decides who gets in (``allow``: Django's default is an authenticated staff user;
Flask has no default, so ``allow`` is required); ``DORMANT_UI_TOKEN`` plays no part here.
An ``allow`` that raises (``current_user.is_admin`` on an anonymous user has no such
attribute) denies, with a 403, and the exception goes to the ``dormant.ui`` log: a broken
check is a refusal, never a 500 nor an open door.
``actions=True`` offers retry and close, whose forms carry the dashboard's own CSRF token
(the Django view is exempt from Django's CSRF middleware for that reason, and checks its
own). The thread page's live view reads the thread's event stream (SSE) from the mount
itself (``thread/events?id=``, behind the same ``allow``; each open page holds one of the
server's threads while it waits, as any WSGI stream does); ``stream_url`` (a function of
the thread id) points it elsewhere instead, e.g. at ``dormant serve``'s stream with
``client.stream_url``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dormant.base_client import BaseClient
from dormant.http.ui.dashboard import Dashboard, StreamUrl, UIRequest, UIResponse

__all__ = ["django_view", "flask_blueprint"]

log = logging.getLogger("dormant.ui")


def _allowed(allow: Callable[..., bool], *args: Any) -> bool:
    """``allow(*args)``, where an exception denies (and is logged with its traceback)."""
    try:
        return bool(allow(*args))
    except Exception:
        log.warning("dashboard: access denied, the host app's allow() raised", exc_info=True)
        return False


def _staff(request: Any) -> bool:
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff)


def django_view(
    client: Callable[[], BaseClient],
    *,
    allow: Callable[[Any], bool] = _staff,
    actions: bool = False,
    stream_url: StreamUrl | None = None,
) -> Callable[..., Any]:
    """A Django view for ``re_path(r"^<prefix>/(?P<path>.*)$", view)``; ``allow(request)``
    decides who may see it (default: an authenticated staff user)."""

    def view(request: Any, path: str = "") -> Any:
        from django.contrib.auth.views import redirect_to_login
        from django.http import HttpResponse, StreamingHttpResponse

        if not _allowed(allow, request):
            user = getattr(request, "user", None)
            if user is not None and not user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            return HttpResponse("the dashboard is for staff", status=403, content_type="text/plain")
        root = request.path[: len(request.path) - len(path)]
        ui = UIRequest(
            method=request.method,
            path=path,
            root=root,
            query=request.GET.dict(),
            form=request.POST.dict() if request.method == "POST" else {},
            cookies=dict(request.COOKIES),
            headers={k.lower(): v for k, v in request.headers.items()},
            secure=request.is_secure(),
        )
        reply = _dashboard(client(), actions, stream_url).handle(ui)
        if reply.stream is not None:
            response = StreamingHttpResponse(
                reply.stream, status=reply.status, content_type=reply.content_type
            )
        else:
            response = HttpResponse(
                reply.body, status=reply.status, content_type=reply.content_type
            )
        for name, value in reply.headers:
            if name == "set-cookie":
                _django_cookie(response, value)
            else:
                response[name] = value
        return response

    view.csrf_exempt = True  # type: ignore[attr-defined]  # the dashboard checks its own token
    return view


def _django_cookie(response: Any, header: str) -> None:
    """Hand a ``Set-Cookie`` header to Django, which keeps cookies apart from headers."""
    first, *attributes = header.split("; ")
    name, _, value = first.partition("=")
    options = {a.split("=", 1)[0].lower(): a.split("=", 1)[1] for a in attributes if "=" in a}
    response.set_cookie(
        name,
        value,
        max_age=int(options["max-age"]) if "max-age" in options else None,
        path=options.get("path", "/"),
        secure="Secure" in attributes,
        httponly=True,
        samesite="Strict",
    )


def flask_blueprint(
    client: Callable[[], BaseClient],
    *,
    allow: Callable[[], bool],
    actions: bool = False,
    stream_url: StreamUrl | None = None,
    name: str = "dormant_dashboard",
) -> Any:
    """A Flask blueprint: ``app.register_blueprint(bp, url_prefix="/dormant/ui")``;
    ``allow()`` decides, inside the request, who may see it."""
    from flask import Blueprint, Response, request

    blueprint = Blueprint(name, __name__)

    @blueprint.route("/", defaults={"path": ""}, methods=["GET", "POST"])
    @blueprint.route("/<path:path>", methods=["GET", "POST"])
    def dashboard(path: str) -> Response:
        if not _allowed(allow):
            return Response("the dashboard needs a signed-in operator", 403, mimetype="text/plain")
        root = request.path[: len(request.path) - len(path)]
        ui = UIRequest(
            method=request.method,
            path=path,
            root=root,
            query=request.args.to_dict(),
            form=request.form.to_dict() if request.method == "POST" else {},
            cookies=dict(request.cookies),
            headers={k.lower(): v for k, v in request.headers.items()},
            secure=request.is_secure,
        )
        reply: UIResponse = _dashboard(client(), actions, stream_url).handle(ui)
        body = reply.stream if reply.stream is not None else reply.body
        response = Response(body, reply.status, content_type=reply.content_type)
        for header, value in reply.headers:
            response.headers.add(header, value)
        return response

    return blueprint


def _dashboard(client: BaseClient, actions: bool, stream_url: StreamUrl | None) -> Dashboard:
    """With no ``stream_url``, the dashboard serves the live view's stream itself."""
    return Dashboard(client, actions=actions, stream_url=stream_url, live=True)
