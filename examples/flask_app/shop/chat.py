"""A chat page that streams the ``chat`` agent's answer as it is written and survives a reload.

``GET /chat/`` is the page (``chat.html``: its script keeps the conversation and the last
stream event id in ``sessionStorage``); ``POST /chat/send`` launches a thread or sends to
it; ``GET /chat/<thread_id>/events`` is the thread's stream as Server-Sent Events, served by
this app (so its own auth can guard it: check the user may read the thread here).
"""

from pathlib import Path

from dormant.http.stream import sse_response
from flask import Blueprint, Response, request

from dormant.errors import DormantError, UnknownThread
from shop import dormant

bp = Blueprint("chat", __name__, url_prefix="/chat")
PAGE = Path(__file__).with_name("chat.html")


@bp.get("/")
def page() -> Response:
    return Response(PAGE.read_bytes(), mimetype="text/html")


@bp.post("/send")
def send() -> tuple[dict[str, str], int]:
    client = dormant.client()
    text, thread_id = request.form["text"], request.form.get("thread") or ""
    try:
        if thread_id:
            client.send(thread_id, text)
        else:
            thread_id = client.launch("chat", text)
    except DormantError as error:
        return {"error": str(error)}, 400
    return {"thread_id": thread_id}, 200


@bp.get("/<thread_id>/events")
def events(thread_id: str) -> Response:
    after = request.headers.get("Last-Event-ID") or request.args.get("after")
    try:
        stream = sse_response(dormant.client(), thread_id, after)
    except UnknownThread:
        return Response("no such thread", 404, mimetype="text/plain")
    return Response(stream.body, stream.status, headers=stream.headers)
