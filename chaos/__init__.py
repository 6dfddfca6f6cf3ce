"""``make chaos``: dormant on real processes under every fault a deployment meets."""
