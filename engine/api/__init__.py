"""The Python API: the graph builder and `optimize` (`builder`), and what it needs to load
data, metrics and functions (`support`). Users import these names from `engine`."""
