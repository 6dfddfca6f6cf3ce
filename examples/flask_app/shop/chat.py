"""A chat page that streams the ``chat`` agent's answer as it is written and survives a reload.

``GET /chat/`` is the page (``chat.html``: its script keeps the conversation and the last
stream event id in ``sessionStorage``); ``POST /chat/send`` launches a thread or sends to
it; ``GET /chat/<thread_id>/events`` is the thread's stream as Server-Sent Events, served by
this app (``Dormant.stream_response``), so its own auth can guard it.
"""

from pathlib import Path

from flask import Blueprint, Response, request

from dormant.errors import DormantError
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
    # A real app checks here that the signed-in user may read thread_id.
    return dormant.stream_response(thread_id)  # honours Last-Event-ID and ?after=
