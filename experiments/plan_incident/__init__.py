"""The incident's chunk plans without a model (`python -m experiments.plan_incident`)."""
