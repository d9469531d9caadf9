"""What pages show, pure: functions that turn run-log rows into figures, HTML, diffs,
graph specs and sentences, testable without Streamlit. No module here imports streamlit
or starts a process (tests/test_layout.py checks): what draws with Streamlit, or starts
a job, is in dashboard/widgets/."""
