"""``python -m fuzz.campaign``: see fuzz.campaign."""

import sys

from fuzz.campaign.runner import main

sys.exit(main())
