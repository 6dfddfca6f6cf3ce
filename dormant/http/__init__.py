"""What talks HTTP: the callback receiver, the webhook receiver, the ASGI app of
``dormant serve`` and the signed tokens of callback URLs.

Their public paths are ``dormant.callbacks``, ``dormant.webhooks`` and ``dormant.serve``.
"""
