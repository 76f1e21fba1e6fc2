"""`python -m vllm_gke.infra.docs`: write the generated docs, then check every link."""

from . import main

raise SystemExit(main())
