"""Thin Ray actor shells around core classes: ``ray.remote`` plus naming, restart options, metrics.

``scheduler.py`` wraps ``pdml_ray.scheduler.Scheduler`` (and gives workers a ``RayTransport`` to it);
``stage.py`` wraps ``pdml_ray.pipeline.stage.StageWorker``. The core never imports this package;
``pdml_ray.train`` and ``pdml_ray.runtime`` launch what is here.
"""
