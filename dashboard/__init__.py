"""The Streamlit dashboard over a run log. Pages read it through `engine.runlog`; the page
writes one thing itself, a run's notes and tags (`engine.runlog.writer.set_notes`), and
starts everything else (runs, probes, blame, forks) as separate `python -m engine`
processes that write their own results. Start it with `streamlit run dashboard/app.py`."""
