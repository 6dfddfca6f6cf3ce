from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import Mapped, mapped_column

db = SQLAlchemy()


class Order(db.Model):  # type: ignore[name-defined,misc]
    """The app's own table: the agent's tool reads it."""

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str]
    status: Mapped[str] = mapped_column(default="new")
    thread_id: Mapped[str] = mapped_column(default="")
