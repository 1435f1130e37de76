"""Drivers of the Ray-actor runtimes (the pipeline today): they launch the shells in
``pdml_ray.actors`` and carry out the core's plans and decisions on them."""
