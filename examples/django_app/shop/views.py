"""Placing an order launches the support agent when, and only if, the order commits."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from proj.celery import app

import dormant.contrib.django
from shop.models import Order
from shop.tasks import mark_received


class _Rejected(Exception):
    pass


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    client = dormant.contrib.django.dormant_client(app)
    try:
        with transaction.atomic():
            order = Order.objects.create(item=request.POST["item"])
            mark_received.delay_on_commit(order.id)
            order.thread_id = client.launch_on_commit("support", f"Where is my order #{order.id}")
            order.save()
            if request.POST.get("reject"):  # lets the README (and tests) show a rollback
                raise _Rejected
    except _Rejected:
        return JsonResponse({"rolled_back": True, "thread_id": order.thread_id}, status=409)
    return JsonResponse({"order": order.id, "thread_id": order.thread_id}, status=201)


@require_GET
def order(request: HttpRequest, order_id: int) -> JsonResponse:
    found = Order.objects.filter(id=order_id).first()
    if found is None:
        return JsonResponse({"error": "no such order"}, status=404)
    return JsonResponse({"order": found.id, "item": found.item, "status": found.status})


@require_GET
def thread(request: HttpRequest, thread_id: str) -> JsonResponse:
    from dormant.errors import UnknownThread

    client = dormant.contrib.django.dormant_client(app)
    try:
        info = client.thread(thread_id)
    except UnknownThread:
        return JsonResponse({"error": "no such thread"}, status=404)
    history = [item.model_dump(mode="json") for item in client.history(thread_id)]
    return JsonResponse({"status": info.status.value, "history": history})
