"""Semantic backpropagation for language-based agentic systems."""

__version__ = "0.1.0"
