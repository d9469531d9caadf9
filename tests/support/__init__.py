"""Test and benchmark support: the fake OpenAI-compatible server."""
