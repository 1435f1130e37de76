"""``python -m pdml_ray.cli``: the same as the ``pdml-ray`` command."""

import sys

from pdml_ray.cli import main

sys.exit(main())
