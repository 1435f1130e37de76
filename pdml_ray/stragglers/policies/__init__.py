"""One module per straggler policy; build them by name with ``pdml_ray.stragglers.registry.make_policy``."""
