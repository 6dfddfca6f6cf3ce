"""The project's own ordinary Celery task, on the same worker as dormant's."""

from celery import shared_task

from shop.models import Order


@shared_task
def mark_received(order_id: int) -> None:
    Order.objects.filter(id=order_id, status="new").update(status="received")
