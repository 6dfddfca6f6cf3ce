"""The webhook receiver's public path: ``from dormant.webhooks import webhook_url, ...``.

The receiver lives in ``dormant/http/webhooks.py``.
"""

from dormant.http.webhooks import (
    WebhookReceiver,
    WebhookReply,
    WebhookSource,
    django_view,
    flask_blueprint,
    github_source,
    webhook_url,
)

__all__ = [
    "WebhookReceiver",
    "WebhookReply",
    "WebhookSource",
    "django_view",
    "flask_blueprint",
    "github_source",
    "webhook_url",
]
