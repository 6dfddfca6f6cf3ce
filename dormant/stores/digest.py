"""The 8-byte digest a message id is remembered by once its row is gone.

The memory store keeps every id a thread accepted this way (``memory/blob.py``), and the
SQL store the ids whose inbox rows retention pruned (``pruned_ids``): a false "seen" needs
a 64-bit collision within one thread (for a million ids, odds below one in ten million).
"""

from __future__ import annotations

import hashlib

__all__ = ["DIGEST_BYTES", "message_digest"]

DIGEST_BYTES = 8


def message_digest(message_id: str) -> bytes:
    return hashlib.blake2b(message_id.encode(), digest_size=DIGEST_BYTES).digest()
