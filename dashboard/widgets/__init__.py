"""Streamlit pieces shared by several pages: each draws what its pure counterpart in
dashboard/views/ computes (same module name), and those that start engine processes do
it through dashboard.jobs."""
