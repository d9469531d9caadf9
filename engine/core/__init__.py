"""The algorithm: the graph spec and its file format, the traced forward pass, the backward
walk every method shares, the loss, and the optimizer's step. Imports nothing from runs,
probes, the API or the command line."""
