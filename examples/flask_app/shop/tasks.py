"""The app's own ordinary Celery task, on the same worker as dormant's."""

from celery import shared_task

from shop.models import Order, db


@shared_task
def mark_received(order_id: int) -> None:
    order = db.session.get(Order, order_id)
    if order is not None and order.status == "new":
        order.status = "received"
        db.session.commit()
