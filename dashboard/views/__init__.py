"""What pages draw. Most modules here are functions that turn run-log rows into figures,
HTML, diffs and graph specs, testable without Streamlit; a few (graph_component, text,
whatif, panes, run_panel, learn_stages) are Streamlit pieces shared by several pages."""
