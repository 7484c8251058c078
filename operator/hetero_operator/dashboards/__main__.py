"""python -m hetero_operator.dashboards --out DIR [--check]"""

import sys

from hetero_operator.dashboards.generate import main

sys.exit(main())
