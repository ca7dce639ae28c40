"""One decode step's parts: tree settings and tensors, growing the tree with the head, prompt
lookup, verification (greedy and rejection sampling), committing accepted KV rows, statistics."""
