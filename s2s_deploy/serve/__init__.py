"""``s2s-deploy serve``: an HTTP JSON service with dynamic batching (extra ``[serve]``)."""
