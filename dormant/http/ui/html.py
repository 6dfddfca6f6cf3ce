"""The dashboard's HTML pieces: escaping, the page shell, status badges and times."""

from __future__ import annotations

import html
import json
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

__all__ = ["ago", "badge", "esc", "href", "json_block", "page", "short"]

STATUSES = ("idle", "waiting", "stalled", "closed")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def href(root: str, path: str, **query: str | None) -> str:
    """A link inside the dashboard, query values encoded (``None`` values left out)."""
    kept = {k: v for k, v in query.items() if v is not None and v != ""}
    return esc(root + path + ("?" + urlencode(kept) if kept else ""))


def short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def badge(status: str) -> str:
    return f'<span class="badge s-{esc(status)}" data-status="{esc(status)}">{esc(status)}</span>'


def ago(when: datetime, now: datetime) -> str:
    """``3 min ago``, with the exact UTC time as the tooltip."""
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 60:
        text = f"{seconds} s ago"
    elif seconds < 3600:
        text = f"{seconds // 60} min ago"
    elif seconds < 86400:
        text = f"{seconds // 3600} h ago"
    else:
        text = f"{seconds // 86400} d ago"
    exact = when.strftime("%Y-%m-%d %H:%M:%S UTC")
    return f'<time datetime="{esc(when.isoformat())}" title="{exact}">{text}</time>'


def json_block(value: Any) -> str:
    return f"<pre class='json'>{esc(json.dumps(value, indent=2, ensure_ascii=False))}</pre>"


def page(title: str, body: str, *, root: str, nav: str = "") -> str:
    """A whole document: the shared stylesheet and script, the top bar, ``body``."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · dormant</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{esc(root)}static/dashboard.css">
<script src="{esc(root)}static/dashboard.js" defer></script>
</head>
<body>
<header class="top"><a class="brand" href="{esc(root)}">dormant</a>
<span class="crumbs">{nav}</span>
<a class="queue" href="{esc(root)}approvals">approvals</a></header>
<main>
{body}
</main>
</body>
</html>
"""
