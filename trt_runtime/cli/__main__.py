"""``python -m trt_runtime.cli``: the same as the ``trt-runtime`` console script."""

import sys

from trt_runtime.cli.entry_point import main

sys.exit(main())
