"""The task board shared by the daemon's agents (`board.py`)."""
