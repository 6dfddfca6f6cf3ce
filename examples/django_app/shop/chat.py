"""A chat page that streams the ``chat`` agent's answer as it is written and survives a reload.

``GET /chat/`` is the page (``chat.html``: its script keeps the conversation and the last
stream event id in ``sessionStorage``); ``POST /chat/send`` launches a thread or sends to
it; ``GET /chat/<thread_id>/events`` is the thread's stream as Server-Sent Events, served by
this project (``dormant.contrib.django.stream_response``), so its own auth can guard it.
"""

from pathlib import Path

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from proj.celery import app

import dormant.contrib.django
from dormant.errors import DormantError

PAGE = Path(__file__).with_name("chat.html")


@require_GET
def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(PAGE.read_bytes(), content_type="text/html")


@csrf_exempt  # the example has no sessions; a real app keeps Django's CSRF check here
@require_POST
def send(request: HttpRequest) -> JsonResponse:
    client = dormant.contrib.django.dormant_client(app)
    text, thread_id = request.POST["text"], request.POST.get("thread") or ""
    try:
        if thread_id:
            client.send(thread_id, text)
        else:
            thread_id = client.launch("chat", text)
    except DormantError as error:
        return JsonResponse({"error": str(error)}, status=400)
    return JsonResponse({"thread_id": thread_id})


@require_GET
def events(request: HttpRequest, thread_id: str) -> HttpResponse:
    # A real app checks here that request.user may read thread_id.
    client = dormant.contrib.django.dormant_client(app)
    return dormant.contrib.django.stream_response(request, client, thread_id)
