"""``python -m fleet.simulate`` (:mod:`fleet.simulate.cli`)."""

from fleet.simulate.cli import main

raise SystemExit(main())
