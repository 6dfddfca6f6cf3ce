"""The shop's own tests: ``python manage.py test`` on a test database Django creates and drops.

The view's launch waits for the commit, which a ``TestCase`` never makes; its callbacks are
captured, not run, so no worker or broker is needed.
"""

from django.test import TestCase
from proj.celery import app

import dormant.contrib.django
from dormant.errors import UnknownAgent


class OrderTests(TestCase):
    def test_placing_an_order_launches_the_support_agent_when_it_commits(self) -> None:
        with self.captureOnCommitCallbacks() as callbacks:
            answer = self.client.post("/orders/", {"item": "teapot"})
        self.assertEqual(answer.status_code, 201)
        self.assertEqual(len(callbacks), 2)  # mark_received and the launch
        thread = self.client.get(f"/threads/{answer.json()['thread_id']}/")
        self.assertEqual(thread.status_code, 404)  # not launched: nothing committed

    def test_a_mistyped_agent_name_is_refused_at_launch(self) -> None:
        client = dormant.contrib.django.dormant_client(app)
        with self.assertRaisesMessage(UnknownAgent, "suport"):
            client.launch_on_commit("suport", "Where is my order #1")
