"""Prompt sets: the default templates and reply parsers (`templates`), the paper's prompt set
(`paper`), and the JSON reply schemas of structured mode (`structured`)."""
