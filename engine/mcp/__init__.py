"""`python -m engine mcp`: the run log's commands as Model Context Protocol tools for coding
agents. server.py holds the tools and resources (on the `mcp` SDK, an optional extra);
commands.py runs the engine's own commands as child processes. Importing this package
imports neither the SDK nor the command line."""
