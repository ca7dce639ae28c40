"""`total_token="auto"`: timing tree budgets on this machine, and the on-disk cache of the picks."""
