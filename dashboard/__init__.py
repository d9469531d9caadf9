"""The Streamlit dashboard: reads the run log, never writes it (runs are started as
separate `python -m engine run` processes). Start it with `streamlit run dashboard/app.py`."""
