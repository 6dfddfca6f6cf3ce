"""Placing an order launches the support agent in the same database transaction as the order:
both commit, or neither exists. The agent is woken after the commit."""

from flask import Blueprint, request

from dormant.errors import UnknownThread
from shop import dormant
from shop.models import Order, db
from shop.tasks import mark_received

bp = Blueprint("shop", __name__)


@bp.post("/orders/")
def create_order() -> tuple[dict[str, object], int]:
    order = Order(item=request.form["item"])
    db.session.add(order)
    db.session.flush()  # the order's id, still inside the transaction
    order.thread_id = dormant.client().launch(
        "support", f"Where is my order #{order.id}", connection=db.session
    )
    if request.form.get("reject"):  # lets the README (and tests) show a rollback
        db.session.rollback()
        return {"rolled_back": True, "thread_id": order.thread_id}, 409
    db.session.commit()
    mark_received.delay(order.id)
    return {"order": order.id, "thread_id": order.thread_id}, 201


@bp.get("/orders/<int:order_id>/")
def get_order(order_id: int) -> tuple[dict[str, object], int]:
    order = db.session.get(Order, order_id)
    if order is None:
        return {"error": "no such order"}, 404
    return {"order": order.id, "item": order.item, "status": order.status}, 200


@bp.get("/threads/<thread_id>/")
def get_thread(thread_id: str) -> tuple[dict[str, object], int]:
    client = dormant.client()
    try:
        info = client.thread(thread_id)
    except UnknownThread:
        return {"error": "no such thread"}, 404
    history = [item.model_dump(mode="json") for item in client.history(thread_id)]
    return {"status": info.status.value, "history": history}, 200
