"""A thread's stream as Server-Sent Events from a Django view, behind the project's own auth.

::

    from django.contrib.auth.decorators import login_required
    from dormant.contrib.django import dormant_client, stream_response
    from proj.celery import app

    @login_required
    def thread_events(request, thread_id):
        # check here that request.user may read thread_id
        return stream_response(request, dormant_client(app), thread_id)

The response is a ``StreamingHttpResponse`` that holds one worker thread while it is open
(WSGI); the body is ``dormant.http.stream.sse_response``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

    from dormant.base_client import BaseClient

__all__ = ["stream_response"]


def stream_response(request: HttpRequest, client: BaseClient, thread_id: str) -> HttpResponse:
    """The stream of ``thread_id`` after the request's ``Last-Event-ID`` header (or its
    ``?after=``): 404 for an unknown thread, 400 for an id no stream gave out."""
    from django.http import HttpResponseBadRequest, HttpResponseNotFound, StreamingHttpResponse

    from dormant.errors import InvalidStreamId, UnknownThread
    from dormant.http.stream import sse_response

    after = request.headers.get("Last-Event-ID") or request.GET.get("after")
    try:
        sse = sse_response(client, thread_id, after)
    except UnknownThread:
        return HttpResponseNotFound(f"unknown thread {thread_id!r}")
    except InvalidStreamId as error:
        return HttpResponseBadRequest(str(error))
    response = StreamingHttpResponse(sse.body, status=sse.status)
    for name, value in sse.headers:
        response[name] = value
    return response
