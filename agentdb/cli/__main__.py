"""`python -m agentdb.cli`, as the `agentdb` command."""

import sys

from agentdb.cli import main

sys.exit(main())
