"""Stores: the protocols and their implementations (memory, SQL, Redis)."""
