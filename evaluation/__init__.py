"""Measuring heads and decoders: the benchmark (bench, methods, report, rounding), the step
profiler, the τ judge's command line (tau), the tree tuner's stability check (tuner_spread), and
checks of the heads in other engines (vllm_engine, serving, sglang_check). It imports eagle,
data_prep and train; none of them imports it. Studies and throughput probes live in experiments/.
"""
