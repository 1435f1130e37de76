"""One module per straggler policy; build them by name with ``pdml_ray.stragglers.registry.make_policy``.

One module per policy:

    sync.py               ``sync``, every worker (the all-reduce baseline)
    ignore_stragglers.py  ``ignore-stragglers``, the first n - s, rescaled
    backup.py             ``backup``, the first n of n + b workers
    gc.py                 ``gc-fr``, ``gc-cr``, gradient coding
    pgc.py                ``pgc-fr``, ``pgc-cr``, pipelined gradient coding
    topk.py               ``topk``, the top K arrived gradients by gradient priority
    async_updates.py      ``async``, bounded-staleness asynchronous updates
"""
