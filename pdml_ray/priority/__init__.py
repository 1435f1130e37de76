"""Priority axes as derivers: each turns worker reports into decisions (measure -> derive -> decide).

    base.py         the seam: ``Deriver`` (ingest, decide, stats, state), ``GaugeValue``, stats protocol
    registry.py     ``DERIVERS``: name -> class and the ``PDMLConfig`` field that enables it
    node.py         node priorities: batch sizes and gradient weights from a fitted step-time model
    sample.py       sample priorities: the loss table, importance sampling, its deriver
    continuity.py   the continuity check: a collapsed (too flat / too peaked) distribution, recalibration
    estimators.py   the one exponential moving average (osprey's latencies, sample scores)
    sumtree.py      the sum-tree behind O(B log N) draws and updates

Pure numpy/torch: nothing here imports ray.
"""
