from django.db import models


class Order(models.Model):
    """The project's own table: the agent's tool reads it."""

    item = models.CharField(max_length=100)
    status = models.CharField(max_length=20, default="new")
    thread_id = models.CharField(max_length=40, blank=True)
