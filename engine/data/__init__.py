"""Datasets, splits and graders."""
