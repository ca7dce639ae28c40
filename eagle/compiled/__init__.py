"""The CPU fast path: the target's and the head's forwards compiled at fixed shapes over
preallocated KV caches, and their grouped-query attention."""
