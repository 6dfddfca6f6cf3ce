"""The callback receiver's public path: ``dormant.callbacks.callback_app(client)``.

The receiver lives in ``dormant/http/callbacks.py``.
"""

from dormant.http.callbacks import callback_app

__all__ = ["callback_app"]
