"""`python -m vllm_gke.infra.contracts [PATH]`: write docs/contracts.md (or PATH) from the table."""

from . import main

raise SystemExit(main())
