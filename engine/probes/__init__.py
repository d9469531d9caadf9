"""Counterfactual probes on a logged run (`probe`) and the per-node verdict built from them
(`blame`)."""
