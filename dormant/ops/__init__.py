"""The operator's tools: the invariant checker, retention, and what ``dormant threads`` and
``dormant show`` print."""
