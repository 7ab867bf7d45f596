import sys

from cupyglm_bench.cli import main

sys.exit(main())
