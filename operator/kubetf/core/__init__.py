"""The decisions, pure: what a TrainingJob becomes, what its pods' states mean, what to do next, and when. No I/O:
no Kubernetes client, no kopf, no clock but the one passed in (import-linter keeps it so). Everything here is
tested without a cluster."""
