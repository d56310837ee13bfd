"""The devices a run ran on: their peak FLOP/s per precision and DRAM bandwidth, for rooflines.

``peaks`` derives them from what the device says about itself (SM count, clocks, memory bus, ISA flags);
``calibrate`` measures them with micro-benchmarks (``xstack calibrate``), caches the result per host and device,
and gives a run's peaks (``peaks_for``), measured where it can, derived where it must.
"""
