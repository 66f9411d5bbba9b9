import sys

from fleetllm.cli import main

sys.exit(main())
