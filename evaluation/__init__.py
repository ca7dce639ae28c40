"""Measuring heads and decoders: the benchmark, the step profiler, the τ judge's command line,
the tree tuner's stability check and throughput tools. The top layer: it imports eagle,
data_prep and train; none of them imports it."""
