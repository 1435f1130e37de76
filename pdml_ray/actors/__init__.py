"""Thin Ray actor shells around core classes: ``ray.remote`` plus naming, restart options, metrics.

One module per runtime, named as its driver in ``pdml_ray.runtime``: ``pipeline.py`` (stage replicas around
``pdml_ray.pipeline.stage.StageWorker``), ``p3_ps.py`` (P3's shards and workers); ``gradient_worker.py``
hosts the gradient workers the straggler and P3 parameter-server runtimes share. ``scheduler.py`` wraps
``pdml_ray.scheduler.Scheduler`` for every runtime; ``scheduler_transport.py`` is how clients reach it and
``snapshot_store.py`` where its restart snapshot lives. The core never imports this package;
``pdml_ray.train`` and ``pdml_ray.runtime`` launch what is here.

Beside those:

    report_relay.py  per-node reporting: a node's relay actor sends its workers' reports as one call per flush
"""
