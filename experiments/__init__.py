"""Measurements and studies, not part of the product: throughput probes of the data pipeline,
the trainer and its loader, the online-against-offline training comparison, and diagnostics of
where a head loses acceptance on a prompt set. Each module runs as `python -m experiments.NAME`.

The top of the layering: it may import eagle, data_prep, train and evaluation; none of them
imports it. It is not installed with the package (pyproject.toml); run it from the repository root.
"""
