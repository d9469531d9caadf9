"""Pure functions that turn run-log rows into HTML and figures; testable without Streamlit."""
